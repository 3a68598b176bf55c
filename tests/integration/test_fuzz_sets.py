"""Fuzzing config.json files and damaged trace sets (issue 9, point 6), with every plugin.

* config.json: a tiny preset of each family as Hugging Face writes it, with keys
  changed to drawn JSON values, removed, or a drawn ``"stage"`` object; `stage report`
  on it is exit 0, or one line with exit 2 (1 for a model too large to lower).
* damaged sets: a written Chakra set truncated, a bit flipped, a file dropped or
  emptied, a record duplicated, dropped or swapped, two files swapped, comm_groups.json
  or manifest.json edited.  `stage validate` never shows a traceback, and refuses
  (exit 1) every change of a trace file and of every manifest field it checks.  The
  fields nothing can check are counted apart: the manifest's model, plan, memory and
  other descriptive fields (nothing in the files says them), and groups no node names.

The CI profile runs a fixed budget of derandomized examples; ``HYPOTHESIS_PROFILE=long``
runs ten times more at random.  Counts per category are printed after the run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stage_adapter_chakra import wire

from stage_core.cli import main

COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
              database=None)
settings.register_profile("ci", max_examples=40, derandomize=True, **COMMON)
settings.register_profile("long", max_examples=400, **COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
STATS: Counter = Counter()


def budget(factor: int = 1):
    profile = settings.get_profile(PROFILE)
    return settings(profile, max_examples=profile.max_examples * factor)


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    yield
    line = f"fuzz ({PROFILE} profile): " + ", ".join(f"{k}: {v}" for k, v in sorted(STATS.items()))
    request.config.fuzz_counts = [*getattr(request.config, "fuzz_counts", []), line]


def run(host, capsys, *argv):
    status = main(list(map(str, argv)), host=host)  # an exception fails the test: a traceback
    return status, capsys.readouterr().err


# --------------------------------------------------------------------------- config.json

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 12),
              st.sampled_from([0, 64, 2**31, 2**63, 10**30, -(2**63)]),
              st.sampled_from([0.5, -1.5, 1e30, math.inf, -math.inf, math.nan, 4096.0]),
              st.text(max_size=6), st.sampled_from(["bfloat16", "silu", "gelu", "flash", "fp32", "llama"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)
STAGE_KEYS = ["name", "vocab_pad_to", "seq_len", "attention", "causal_flops", "dtype", "capacity_factor", "bogus"]
TINY = ["gpt-tiny", "llama-tiny", "moe-tiny", "moe-mla-tiny", "gemma-tiny", "mamba2-tiny", "hybrid-tiny"]


@st.composite
def config_jsons(draw, host):
    name = draw(st.sampled_from(TINY))
    spec = next(s for s in host.models() if name in s.presets)
    data = spec.presets[name].to_hf()
    keys = sorted(data)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "set", "delete", "stage", "model_type"]))
        if action == "set":
            data[draw(st.sampled_from(keys))] = draw(JSON_VALUES)
        elif action == "delete" and data:
            data.pop(draw(st.sampled_from(sorted(data))), None)
        elif action == "stage":
            data["stage"] = draw(st.one_of(JSON_VALUES, st.dictionaries(st.sampled_from(STAGE_KEYS), JSON_VALUES,
                                                                        max_size=3)))
        else:
            data["model_type"] = draw(st.sampled_from(["gpt2", "llama", "mixtral", "deepseek_v3", "gemma2",
                                                       "mamba2", "nemotron_h", "bert", ""]))
    return name, data


@pytest.mark.parametrize("shape", ["object"])
def test_any_config_json(shape, host, tmp_path_factory, capsys):
    @budget()
    @given(drawn=config_jsons(host))
    def check(drawn):
        name, data = drawn
        path = tmp_path_factory.mktemp("config") / "config.json"
        path.write_text(json.dumps(data))  # (inf and nan as JSON's Infinity and NaN)
        status, err = run(host, capsys, "report", "--model", path, "--json")
        assert "Traceback" not in err
        if status:
            lines = err.strip().splitlines()
            assert status in (1, 2) and len(lines) == 1 and lines[0].startswith("stage: error: "), err
        STATS[f"config.json exit {status}"] += 1

    check()


# --------------------------------------------------------------------------- damaged sets

PLANS = {
    "gpt-tiny pp2 dp2": ["--model", "gpt-tiny", "--pp", "2", "--dp", "2", "--micro-batches", "2"],
    "llama-tiny tp2 timed": ["--model", "llama-tiny", "--tp", "2", "--gpu", "h100"],
    "moe-tiny ep2": ["--model", "moe-tiny", "--ep", "2", "--dp", "2"],
}
#: manifest fields validate compares with the files (a path's parts, * for any index)
CHECKED = ("world_size", "rank_classes", "rank_classes.*", "rank_classes.*.ranks", "rank_classes.*.ranks.*",
           "rank_classes.*.flops", "rank_classes.*.flops.matmul", "rank_classes.*.flops.other",
           "rank_classes.*.flops.total", "rank_classes.*.comm_bytes", "rank_classes.*.comm_bytes.*",
           "rank_classes.*.nodes", "rank_classes.*.kernel_bytes", "rank_classes.*.program_sha256",
           "rank_classes.*.compute_time_us")


@pytest.fixture(scope="module")
def sets(host, tmp_path_factory):
    out = {}
    for label, argv in PLANS.items():
        folder = tmp_path_factory.mktemp("fuzz-set") / "set"
        assert main(["generate", *argv, "-o", str(folder)], host=host) == 0
        out[label] = folder
    return out


def records(data: bytes) -> list[tuple[int, int]]:
    _, starts = wire.split_frames(data)
    return list(zip(starts, starts[1:]))


def leaves(doc, path=()):
    """(path, value) of every value in a JSON document, containers included."""
    yield path, doc
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from leaves(value, (*path, key))


def pattern(path) -> str:
    return ".".join("*" if isinstance(p, int) else str(p) for p in path)


def checked(path) -> bool:
    """Whether validate compares the manifest field at ``path`` with the files."""
    parts = pattern(path).split(".")
    return any(len(parts) == len(c) and all(b in ("*", a) for a, b in zip(parts, c))
               for c in (c.split(".") for c in CHECKED))


def used_groups(folder: Path) -> set[str]:
    from stage_adapter_chakra.etread import read

    return {n.attr("pg_name") for _, nodes in read(folder).iter_ranks() for n in nodes if n.attr("pg_name")}


KINDS = ["truncate", "flip", "flip", "drop file", "empty file", "duplicate record", "drop record",
         "swap records", "swap files", "edit comm_groups.json", "edit manifest.json", "edit manifest.json"]


def damage(draw, folder: Path, used: set[str]) -> tuple[str, bool]:
    """Damage the set in ``folder``; (category, whether validate must refuse it)."""
    kind = draw(st.sampled_from(KINDS))
    files = sorted(folder.glob("trace.*.et"), key=lambda p: int(p.name.split(".")[1]))
    path = draw(st.sampled_from(files))
    data = path.read_bytes()
    bounds = records(data)
    if kind == "truncate":
        path.write_bytes(data[:draw(st.integers(0, len(data) - 1))])
    elif kind == "flip":
        cut = bytearray(data)
        cut[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        path.write_bytes(bytes(cut))
    elif kind == "drop file":
        path.unlink()
    elif kind == "empty file":
        path.write_bytes(b"")
    elif kind in ("duplicate record", "drop record", "swap records"):
        i = draw(st.integers(1, len(bounds) - 2))
        (a, b), (c, d) = bounds[i], bounds[i + 1]
        if kind == "duplicate record":
            path.write_bytes(data[:b] + data[a:b] + data[b:])
        elif kind == "drop record":
            path.write_bytes(data[:a] + data[b:])
        else:
            if data[a:b] == data[c:d]:
                return kind + " (identical)", False
            path.write_bytes(data[:a] + data[c:d] + data[a:b] + data[d:])
    elif kind == "swap files":
        other = draw(st.sampled_from(files))
        if other.read_bytes() == data:
            return kind + " (identical)", False
        path.write_bytes(other.read_bytes())
        other.write_bytes(data)
    else:
        name = "comm_groups.json" if "comm_groups" in kind else "manifest.json"
        doc = json.loads((folder / name).read_text())
        where, old = draw(st.sampled_from([(p, v) for p, v in leaves(doc) if p]))
        value = draw(st.one_of(JSON_VALUES, st.just(old + 1) if type(old) is int else st.nothing()))
        parent = doc
        for part in where[:-1]:
            parent = parent[part]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[where[-1]]
            value = "(removed)"
        else:
            parent[where[-1]] = value
        if value == old and type(value) is type(old):
            return kind + " (same value)", False
        (folder / name).write_text(json.dumps(doc))
        if name == "manifest.json":
            optional = {"rank_classes.*.program_sha256": "as --no-validate writes",
                        "rank_classes.*.nodes": "as an older STAGE wrote", "rank_classes.*.kernel_bytes": "likewise"}
            if value == "(removed)" and pattern(where) in optional:
                return kind + f" (unchecked: {pattern(where)} removed, {optional[pattern(where)]})", False
            return kind + ("" if checked(where) else f" (unchecked: {pattern(where)})"), checked(where)
        return kind + ("" if where[0] in used else " (a group no node names)"), where[0] in used
    return kind, True


@pytest.mark.parametrize("label", list(PLANS))
def test_any_damage_to_a_set(label, sets, host, tmp_path_factory, capsys):
    used = used_groups(sets[label])

    @budget()
    @given(data=st.data())
    def check(data):
        folder = tmp_path_factory.mktemp("damaged") / "set"
        shutil.copytree(sets[label], folder)
        category, must_refuse = damage(data.draw, folder, used)
        status, err = run(host, capsys, "validate", folder)
        assert "Traceback" not in err
        lines = err.strip().splitlines()
        assert all(line.startswith(("stage: ", f"{folder}: ")) for line in lines), err
        if status == 0:
            assert not must_refuse, f"{category}: passed validate"
        else:
            assert status == 1 and lines, (status, err)
            assert not lines[0].startswith("stage: error") or len(lines) == 1, err  # a read error: one line
        STATS[f"{category}: {'refused' if status else 'passed'}"] += 1
        shutil.rmtree(folder.parent, ignore_errors=True)

    check()
