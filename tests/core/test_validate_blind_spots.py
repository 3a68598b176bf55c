"""Validate without blind spots (issue 26, point 2): a group's ring order against the plan,
a set without its manifest, the simulator's first-tick abort, a world too large to lay out.
The real simulator's side of each is in tests/integration/test_validate_blind_spots.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


from stage_core.cli import main
from stage_core.hardware import roofline_ns


from stage_core.testing import fresh_host, jsonl_plugin, toy_plugin
from stage_core.trace import NodeType, TraceNode, TraceSet
from stage_core.validate import examine

from conftest import DP

#: an H100's roofline as ASTRA-sim's system.json gives it (TFLOPS bf16 dense, HBM GB/s)
H100 = (989.4, 3350.0)


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"))


@pytest.fixture
def toy_set(host, tmp_path):
    out = tmp_path / "set"
    assert main(["generate", "--model", "toy", "--dp", "4", "--format", "jsonl", "-q", "-o", str(out)], host=host) == 0
    return out


def validate(host, capsys, folder, *more):
    capsys.readouterr()  # (what generate printed)
    status = main(["validate", str(folder), *more], host=host)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_reordered_group_is_refused_against_the_plan(host, capsys, toy_set):
    groups = json.loads((toy_set / "comm_groups.json").read_text())
    assert groups == {"1": [0, 1, 2, 3]}  # the dp group, as the plan's mesh lays it out
    (toy_set / "comm_groups.json").write_text(json.dumps({"1": [0, 2, 1, 3]}))  # same members, another ring
    status, out, err = validate(host, capsys, toy_set)
    assert status == 1
    assert ("comm group '1' lists its members as [0, 2, 1, 3], not in the plan's ring order [0, 1, 2, 3]"
            in err.splitlines()[0])


def test_a_set_without_manifest_says_its_costs_are_unchecked(host, capsys, toy_set):
    (toy_set / "manifest.json").unlink()
    status, out, err = validate(host, capsys, toy_set)  # (the jsonl backend marks no generator)
    assert status == 0
    first, second = out.splitlines()
    assert first == f"{toy_set}: no manifest.json: its costs are unchecked (FLOPs, bytes, durations, programs " \
                    f"and the groups' ring order are compared with nothing; only structure, groups, pairs and " \
                    f"the replay are checked)"
    assert second.startswith(f"{toy_set}: 4 ranks, valid")
    status, out, err = validate(host, capsys, toy_set, "--require-manifest")
    assert status == 1 and out == "" and err.count("\n") == 1
    assert "no manifest.json (--require-manifest): without it the set's costs cannot be checked" in err


def test_a_set_stage_wrote_needs_its_manifest_by_default(host, capsys, monkeypatch, toy_set):
    # what the chakra reader says of a STAGE set (its traces' GlobalMetadata)
    from stage_core import testing

    real = testing.read_jsonl
    monkeypatch.setattr(testing, "read_jsonl", lambda d: _with(real(d), generator="stage 0.1.0"))
    marked = fresh_host((toy_plugin, "toy"), (testing._JsonlPlugin(), "jsonl"), (DP(), "dp"))
    # a kernel made 1,000x longer: with the manifest, the costs say so
    _scale_first_kernel(toy_set, 1000)
    status, out, err = validate(marked, capsys, toy_set)
    assert status == 1 and "FLOPs (num_ops), but manifest.json rank class 0 says" in err
    (toy_set / "manifest.json").unlink()
    status, out, err = validate(marked, capsys, toy_set)  # it passed, silently, before issue 26
    assert status == 1 and "no manifest.json (its traces say stage 0.1.0 wrote it)" in err
    status, out, err = validate(marked, capsys, toy_set, "--no-require-manifest")
    assert status == 0 and out.splitlines()[0].endswith("replay are checked)")


def _with(trace_set: TraceSet, **metadata) -> TraceSet:
    from dataclasses import replace

    return replace(trace_set, metadata={**trace_set.metadata, **metadata})


def _scale_first_kernel(folder, factor):
    for path in folder.glob("trace.*.jsonl"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            node = json.loads(line)
            if node["type"] == int(NodeType.COMP):
                node["attrs"]["num_ops"][1] *= factor
                lines[i] = json.dumps(node)
                break
        path.write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- the first tick


def kernel(nid, nbytes, ops=1, micros=0, deps=()):
    return TraceNode(nid, f"k{nid}", NodeType.COMP, list(deps), [], {
        "is_cpu_op": ("bool_val", False), "num_ops": ("int64_val", ops), "tensor_size": ("uint64_val", nbytes)},
        micros)


def one_rank(*nodes):
    return TraceSet(1, {}, lambda: iter([(0, list(nodes))]))


def test_the_hand_worked_rooflines():
    # 520 bytes at 3,350 GB/s: 0.155 ns, truncated to 0; 4,000 bytes: 1.19 ns, 1
    assert roofline_ns(1, 520, *H100) == 0
    assert roofline_ns(1, 4000, *H100) == 1


def test_a_first_kernel_of_0_ns_is_an_abort_in_the_verdict():
    # the decode step of a 256-wide model: its embedding gather reads one row of 512 bytes
    verdict = examine(one_rank(kernel(0, 520), kernel(1, 10**9, deps=[0])), rooflines={"h100": H100}).verdict
    assert not verdict.finishes and verdict.unfinished == ()
    tick = verdict.first_tick
    assert (tick.ranks, tick.node_id, tick.name, tick.tensor_size, tick.gpus) == ((0,), 0, "k0", 520, ("h100",))


@pytest.mark.parametrize("nodes", [
    (kernel(0, 4000), kernel(1, 64, deps=[0])),  # 1 ns first; a later kernel of 0 ns is no first tick
    (kernel(0, 520, micros=3),),  # timed: ASTRA-sim replays its duration
    (kernel(1, 10**9), kernel(0, 10**9, deps=[1]), kernel(2, 64, deps=[0])),  # the first root by id is node 1
])
def test_what_is_no_first_tick(nodes):
    assert examine(one_rank(*nodes), rooflines={"h100": H100}).verdict.first_tick is None


def test_without_rooflines_the_verdict_is_the_replays():
    assert examine(one_rank(kernel(0, 520))).verdict.finishes


# --------------------------------------------------------------------------- bounded


def test_a_manifest_claiming_a_trillion_ranks_is_refused_before_anything_is_laid_out(tmp_path):
    # it made the kernel's OOM killer end validate at 22.9 GB; 2 GB of address space is plenty now
    out = tmp_path / "set"
    script = f"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from stage_core.cli import main
from stage_core.testing import fresh_host, jsonl_plugin, toy_plugin
host = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"))
assert main(["generate", "--model", "toy", "--format", "jsonl", "-q", "-o", {str(out)!r}], host=host) == 0
m = json.load(open({str(out / 'manifest.json')!r}))
m["world_size"] = 10**12
json.dump(m, open({str(out / 'manifest.json')!r}, "w"))
sys.exit(main(["validate", {str(out)!r}], host=host))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip() == (f"stage: error: {out / 'manifest.json'}: world_size 1,000,000,000,000 is above "
                                  f"the 1,048,576 ranks STAGE reads and checks")
