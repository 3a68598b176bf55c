"""Grids of plans (stage_core.grid) and units of work named by their content (stage_core.unitcache)."""

import hashlib
import os

import numpy as np
import pytest

from stage_core.api import UnitCache, UsageError, code_versions, grid, unit_id
from stage_core.testing import fresh_host, toy_plugin

NAMES = ("model", "tp", "dp", "sp", "seq-len")


def test_a_grid_is_the_product_of_its_lists_under_the_base_settings():
    sweep = grid.parse({"measure": "estimate", "base": {"model": "toy", "sp": True},
                        "grid": {"tp": [1, 2], "dp": [1, 2, 4]}}, "g.toml", NAMES, ("report", "estimate"))
    assert sweep.measure == "estimate" and sweep.keys == ("model", "sp", "tp", "dp")
    assert [(p.as_dict()["tp"], p.as_dict()["dp"]) for p in sweep.points] == [
        (1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4)]
    assert sweep.points[4].flags() == ["--model", "toy", "--sp", "--tp", "2", "--dp", "2"]


def test_an_array_of_grids_is_the_union_of_their_products_without_repeats():
    sweep = grid.parse({"grid": [{"tp": [1, 2]}, {"tp": [2, 4], "system": ["h100"]}, {"tp": [1]}]}, "g",
                       NAMES, ("report",))
    assert [p.as_dict() for p in sweep.points] == [{"tp": 1}, {"tp": 2}, {"tp": 2, "system": "h100"},
                                                   {"tp": 4, "system": "h100"}]
    # the hardware is the point's, not a plan flag
    assert sweep.points[2].flags() == ["--tp", "2"] and sweep.points[2].hardware() == {"system": "h100"}
    assert sweep.measure == "report"  # the first measure the command knows


@pytest.mark.parametrize("data,message", [
    ({"grid": {"tp": 2}}, "[grid] tp = 2: give a non-empty list of values"),
    ({"grid": {"tpp": [2]}}, "[grid] tpp: not a setting; valid: dp, model, seq-len, sp, system, tp"),
    ({"measure": "guess"}, "measure = 'guess'; valid: report, estimate"),
    ({"base": {"model": ["a"]}}, "[base] model = ['a']: values are strings, numbers or booleans"),
    ({"colour": 1}, "unknown top-level key 'colour'; valid: measure, base, grid"),
])
def test_a_bad_grid_is_one_usage_error_naming_the_value(data, message):
    with pytest.raises(UsageError) as info:
        grid.parse(data, "g.toml", NAMES, ("report", "estimate"))
    assert str(info.value) == f"g.toml: {message}"


def test_a_grid_file_that_is_not_toml_is_refused(tmp_path):
    (tmp_path / "g.toml").write_text("[grid\n")
    with pytest.raises(UsageError, match=r"g.toml: not valid TOML"):
        grid.load(tmp_path / "g.toml", NAMES, ("report",))
    with pytest.raises(UsageError, match=r"absent.toml: cannot read it"):
        grid.load(tmp_path / "absent.toml", NAMES, ("report",))


def test_a_unit_id_is_the_sha256_of_its_canonical_json():
    # the canonical JSON of {"b": [2, 3], "a": 1} is '{"a":1,"b":[2,3]}' (keys sorted, no spaces)
    assert unit_id({"b": [2, 3], "a": 1}) == hashlib.sha256(b'{"a":1,"b":[2,3]}').hexdigest()
    assert unit_id({}) == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"  # sha256("{}")


def test_code_versions_name_the_core_and_each_versioned_plugin():
    from stage_core import __version__

    host = fresh_host((toy_plugin, "toy"))
    host.versions["toy"] = "9.9"
    assert code_versions(host) == {"stage-core": __version__, "toy": "9.9"}


def test_the_cache_keeps_results_by_id_and_treats_a_damaged_one_as_absent(tmp_path):
    cache = UnitCache(tmp_path / "c")
    uid = unit_id({"flags": ["--tp", "2"]})
    assert cache.read_json(uid) is None
    cache.write_json(uid, {"row": {"step_time_s": 0.25}})
    assert cache.read_json(uid) == {"row": {"step_time_s": 0.25}}
    cache.path(uid).write_text("{not json")
    assert cache.read_json(uid) is None
    # any format, through a writer and a reader of the open file
    cache.write(uid, ".npz", lambda f: np.savez(f, y=np.array([1.5, 2.5])))
    assert cache.read(uid, ".npz", lambda p: np.load(p)["y"].tolist()) == [1.5, 2.5]
    cache.path(uid, ".npz").write_bytes(b"PK\x03\x04 truncated")
    assert cache.read(uid, ".npz", lambda p: np.load(p)["y"].tolist()) is None
    assert not [p for p in os.listdir(tmp_path / "c") if p.endswith(".tmp")]


def test_a_writer_that_fails_leaves_no_file(tmp_path):
    cache = UnitCache(tmp_path)

    def broken(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        cache.write("abc", ".json", broken)
    assert os.listdir(tmp_path) == []


def test_a_cache_folder_that_cannot_be_made_is_one_usage_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"--cache .*file/c: cannot create it"):
        UnitCache(tmp_path / "file" / "c")
