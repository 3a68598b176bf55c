"""stage sweep: a grid into one table, incrementally; specs checked up front."""

import csv
import io
import json
import math
from contextlib import redirect_stdout

import pytest

from stage_core.api import UsageError, grid, main, unit_id
from stage_search import executors, units
from stage_search.sweep import plan_flag_names, run_sweep


def toy_matmul_flops(s, layers=2, h=64, f=256, V=128, b=1):
    """One training step of the toy model on one GPU, by hand: forward matmuls per layer
    (qkv 2bsh*3h, scores and context 2*2bs^2h, out 2bsh^2, MLP 2*2bshf) and the tied head
    2bshV; backward costs twice the forward (REFERENCE.md 1)."""
    per_layer = 2 * b * s * h * 3 * h + 4 * b * s * s * h + 2 * b * s * h * h + 4 * b * s * h * f
    return 3 * (layers * per_layer + 2 * b * s * h * V)


GRID = """
[base]
model = "toy"
[grid]
seq-len = [16, 32]
model = ["toy", "toy-wide"]
dp = [1, 2]
"""


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_every_point_is_a_row_with_the_numbers_of_its_plan(toy_host, tmp_path, capsys):
    (tmp_path / "grid.toml").write_text(GRID)
    out = tmp_path / "sweep.csv"
    assert main(["sweep", str(tmp_path / "grid.toml"), "-o", str(out), "--cache", str(tmp_path / "c"),
                 "--workers", "1"], host=toy_host) == 0
    rows = read_csv(out)
    assert [(r["seq-len"], r["model"], r["dp"]) for r in rows] == [
        (s, m, d) for s in ("16", "32") for m in ("toy", "toy-wide") for d in ("1", "2")]
    for r in rows:
        if r["dp"] == "2":  # no strategy plugin is installed here: the core refuses the plan
            assert r["status"] == "invalid" and "dp" in r["error"] and "install stage-parallel" in r["error"]
            continue
        wide = r["model"] == "toy-wide"
        s = int(r["seq-len"])
        expected = toy_matmul_flops(s, h=128, f=512) if wide else toy_matmul_flops(s)
        assert (r["status"], r["world_size"], int(r["matmul_flops_per_step"])) == ("ok", "1", expected)
    assert "8 points: 0 cached, 8 to evaluate" in capsys.readouterr().err


def test_a_rerun_evaluates_only_new_points(toy_host, tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    cache = tmp_path / "cache"
    run_sweep(grid, tmp_path / "a.csv", workers=1, cache=cache)
    first = (tmp_path / "a.csv").read_text()
    run_sweep(grid, tmp_path / "b.csv", workers=1, cache=cache)
    assert "8 cached, 0 to evaluate" in capsys.readouterr().err
    assert (tmp_path / "b.csv").read_text() == first
    grid.write_text(GRID.replace("[16, 32]", "[16, 32, 8]"))
    run_sweep(grid, tmp_path / "c.csv", workers=1, cache=cache)
    assert "12 points: 8 cached, 4 to evaluate" in capsys.readouterr().err
    # a damaged unit is evaluated again, not trusted
    victim = sorted(cache.glob("*.json"))[0]
    victim.write_text("{not json")
    run_sweep(grid, tmp_path / "d.csv", workers=1, cache=cache)
    assert "11 cached, 1 to evaluate" in capsys.readouterr().err
    assert (tmp_path / "d.csv").read_text() == (tmp_path / "c.csv").read_text()


def test_json_and_csv_tables_hold_the_same_rows(toy_host, tmp_path):
    (tmp_path / "grid.toml").write_text(GRID)
    run_sweep(tmp_path / "grid.toml", tmp_path / "t.csv", workers=1, cache=tmp_path / "c")
    run_sweep(tmp_path / "grid.toml", tmp_path / "t.json", workers=1, cache=tmp_path / "c")
    as_json = json.loads((tmp_path / "t.json").read_text())
    as_csv = read_csv(tmp_path / "t.csv")
    assert [{k: "" if v is None else str(v) for k, v in r.items()} for r in as_json] == as_csv


@pytest.mark.parametrize("text,message", [
    ("[grid]\ntp = 2\n", "give a non-empty list"),
    ("[grid]\ntpp = [2]\n", "tpp: not a setting; valid:"),
    ("measure = 'guess'\n", "measure = 'guess'; valid: report"),
    ("[base]\nmodel = ['a']\n", "values are strings, numbers or booleans"),
    ("colour = 1\n", "unknown top-level key 'colour'"),
    ("[grid\n", "not valid TOML"),
])
def test_bad_specs_are_one_line_usage_errors(toy_host, tmp_path, capsys, text, message):
    (tmp_path / "bad.toml").write_text(text)
    assert main(["sweep", str(tmp_path / "bad.toml"), "-o", str(tmp_path / "x.csv")], host=toy_host) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "x.csv").exists()


def test_bad_options_are_refused_before_any_work(toy_host, tmp_path):
    (tmp_path / "g.toml").write_text(GRID)
    with pytest.raises(UsageError, match=r"unknown table format '.xlsx'; valid: .csv, .json, .parquet"):
        run_sweep(tmp_path / "g.toml", tmp_path / "t.xlsx")
    with pytest.raises(UsageError, match="--executor slurm: unknown executor; known: local"):
        run_sweep(tmp_path / "g.toml", tmp_path / "t.csv", executor="slurm")
    with pytest.raises(UsageError, match="--workers 0"):
        run_sweep(tmp_path / "g.toml", tmp_path / "t.csv", workers=0)


def test_points_spell_the_plan_flags_of_stage_report():
    names = plan_flag_names()
    assert {"model", "tp", "dp", "pp", "sp", "zero", "seq-len", "micro-batches"} <= set(names)
    point = grid.parse({"base": {"model": "m", "sp": True}, "grid": {"tp": [2]}}, "x", names, units.MEASURES).points[0]
    assert point.flags() == ["--model", "m", "--sp", "--tp", "2"]


def test_the_local_executor_returns_every_result_once_with_its_index():
    items = list(range(1, 41))
    got = dict(executors.local(math.factorial, items, {"workers": 2}))
    assert sorted(got) == list(range(40)) and got[19] == 2_432_902_008_176_640_000  # 20!


@pytest.fixture
def timed_host(monkeypatch):
    """The toy model, the h100 preset and a roofline compute model."""
    from search_hardware import Hardware
    from stage_search import plugin

    from stage_core.testing import fresh_host, toy_plugin

    host = fresh_host((toy_plugin, "toy"), (plugin, "search"), (Hardware(), "hw"))
    monkeypatch.setattr(units, "_host", lambda: host)
    return host


def test_an_estimate_sweep_gives_each_points_step_on_its_gpu(timed_host, tmp_path):
    """Every point's step_time_s is what stage estimate prints for the same flags."""
    (tmp_path / "grid.toml").write_text('measure = "estimate"\n[base]\nmodel = "toy"\n[grid]\nseq-len = [16, 32]\n'
                                        'micro-batches = [1, 2]\n')
    out = tmp_path / "sweep.json"
    run_sweep(tmp_path / "grid.toml", out, workers=1, cache=tmp_path / "c")
    rows = json.loads(out.read_text())
    assert [(r["seq-len"], r["micro-batches"]) for r in rows] == [(16, 1), (16, 2), (32, 1), (32, 2)]
    for r in rows:
        got = io.StringIO()
        with redirect_stdout(got):
            assert main(["estimate", "--model", "toy", "--seq-len", str(r["seq-len"]), "--micro-batches",
                         str(r["micro-batches"]), "--gpu", "h100", "--json"], host=timed_host) == 0
        expected = json.loads(got.getvalue())
        assert (r["status"], r["hardware"]) == ("ok", "h100")
        assert r["step_time_s"] == expected["step_time_s"] and r["mfu"] == expected["mfu"]
    # two micro-batches run the step's kernels twice, the optimizer once: under twice the time
    assert rows[0]["step_time_s"] < rows[1]["step_time_s"] < 2 * rows[0]["step_time_s"]


def test_a_simulate_sweep_without_a_simulator_says_so_per_point(timed_host, tmp_path):
    (tmp_path / "grid.toml").write_text('measure = "simulate"\n[base]\nmodel = "toy"\n[grid]\nseq-len = [16]\n')
    out = tmp_path / "sweep.csv"
    run_sweep(tmp_path / "grid.toml", out, workers=1, cache=tmp_path / "c")
    [row] = read_csv(out)
    assert row["status"] == "not simulated" and "no simulator is installed" in row["error"]
    assert float(row["step_time_s"]) > 0 and row["simulated_step_time_s"] == ""


def test_a_simulate_sweep_names_its_simulator_in_every_unit(toy_host, tmp_path):
    """--simulator NAME picks a stage_simulators record (ASTRA-sim's: astrasim, astrasim-aware,
    astrasim-htsim); it joins the unit, so its results are cached apart, and a sweep without
    one keeps the unit ids it had.  A name no plugin registers, or a spec that does not
    simulate, is refused before any work."""
    from stage_core.api import grid
    from stage_search.sweep import plan_units

    sweep = grid.parse({"measure": "simulate", "base": {"model": "toy"}}, "x", plan_flag_names(), units.MEASURES)
    [a], [b] = plan_units(sweep), plan_units(sweep, "astrasim-htsim")
    assert "simulator" not in a and b == {**a, "simulator": "astrasim-htsim"}
    assert unit_id(a) != unit_id(b)
    (tmp_path / "s.toml").write_text('measure = "simulate"\n[base]\nmodel = "toy"\n')
    with pytest.raises(UsageError, match="--simulator nosuch: unknown simulator; known: none installed"):
        run_sweep(tmp_path / "s.toml", tmp_path / "t.csv", simulator="nosuch")
    (tmp_path / "r.toml").write_text('[base]\nmodel = "toy"\n')
    with pytest.raises(UsageError, match="measures 'report'; the simulator runs with measure"):
        run_sweep(tmp_path / "r.toml", tmp_path / "t.csv", simulator="astrasim")
    assert not (tmp_path / "t.csv").exists()
