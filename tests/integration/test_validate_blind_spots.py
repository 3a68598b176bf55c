"""Validate without blind spots (issue 26, point 2), on Chakra sets and in the real simulator:
a group's ring order is part of the cost, a STAGE set without its manifest is refused by
default, a manifest's world size is bounded before anything is laid out.  (The first
tick: test_first_tick.py.)"""

import json
import resource
import shutil
import subprocess
import sys

from stage_adapter_chakra import schema, wire


def test_a_reordered_ring_changes_the_step_and_validate_refuses_it(run_stage, tmp_path, simulate):
    # ASTRA-sim runs a collective of a group smaller than the world as one ring over the
    # members in comm_groups.json order, a message between ranks a and b crossing InfiniBand
    # when a mod 8 == b mod 8, NVLink otherwise (docs/design.md); tp2 x dp16: the dp groups
    # of 16 ranks, 0, 2, ..., 30, all NVLink hops in the plan's order
    out = tmp_path / "dp16"
    assert run_stage("generate", "--model", "gpt-tiny", "--tp", "2", "--dp", "16", "-q", "-o", out).returncode == 0
    groups = json.loads((out / "comm_groups.json").read_text())
    assert groups["17"] == list(range(0, 32, 2))
    status, before = simulate(out)
    assert status == 0
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    # the same members, every rank next to one of its own residue mod 8: InfiniBand hops
    groups = {name: sorted(ranks, key=lambda r: (r % 8, r)) if len(ranks) == 16 else ranks
              for name, ranks in groups.items()}
    assert groups["17"][:4] == [0, 8, 16, 24]
    (moved / "comm_groups.json").write_text(json.dumps(groups))
    checked = run_stage("validate", moved)
    assert checked.returncode == 1
    assert "comm group '17' lists its members as [0, 8, 16, 24, 2, 10, 18, 26, ... 16 ranks], not in the plan's " \
           "ring order [0, 2, 4, 6, 8, 10, 12, 14, ... 16 ranks]" in checked.stderr
    status, after = simulate(moved, validate=False)
    assert status == 0
    step = [r["summary"]["max_finish_time_ns"] for r in (before, after)]
    assert step[1] > step[0], step  # the gradients' all-reduce over InfiniBand: the step takes longer


def _scale_duration(path, factor) -> tuple[str, int]:
    """Multiply the duration of the longest compute node of a trace file by ``factor``."""
    data = path.read_bytes()
    records, _ = wire.split_frames(data)
    nodes = [schema.Node.FromString(r) for r in records[1:]]
    longest = max((n for n in nodes if n.type == 4), key=lambda n: n.duration_micros)  # COMP_NODE
    was = longest.duration_micros
    longest.duration_micros = was * factor
    path.write_bytes(wire.frame(records[0]) + b"".join(wire.frame(n.SerializeToString()) for n in nodes))
    return longest.name, was


def test_a_kernel_made_1000x_longer_is_refused_with_or_without_the_manifest(run_stage, tmp_path, simulate):
    out = tmp_path / "timed"
    assert run_stage("generate", "--model", "gpt-tiny", "--dp", "2", "--gpu", "h100", "-q", "-o", out).returncode == 0
    manifest = json.loads((out / "manifest.json").read_text())
    compute_us = manifest["rank_classes"][0]["compute_time_us"]
    name, micros = _scale_duration(out / "trace.0.et", 1000)
    assert micros > 0
    checked = run_stage("validate", out)
    assert checked.returncode == 1 and "compute_time_us" in checked.stderr
    (out / "manifest.json").unlink()
    checked = run_stage("validate", out)  # before issue 26: "2 ranks, valid", nothing said of costs
    assert checked.returncode == 1 and checked.stdout == ""
    assert checked.stderr.strip().startswith(f"stage: invalid trace: {out}: no manifest.json (its traces say stage ")
    checked = run_stage("validate", out, "--no-require-manifest")
    assert checked.returncode == 0
    assert checked.stdout.splitlines()[0] == (
        f"{out}: no manifest.json: its costs are unchecked (FLOPs, bytes, durations, programs and the groups' ring "
        f"order are compared with nothing; only structure, groups, pairs and the replay are checked)")
    # what passing it would have meant: the simulator's step holds the kernel's 999 extra durations
    (out / "manifest.json").write_text(json.dumps(manifest))  # (for the simulator's hardware)
    status, results = simulate(out, validate=False)
    assert status == 0
    assert results["summary"]["max_finish_time_ns"] >= (compute_us + 999 * micros) * 1000


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_manifest_claiming_a_trillion_ranks_is_one_line_in_bounded_memory(run_stage, tmp_path):
    out = tmp_path / "set"
    assert run_stage("generate", "--model", "gpt-tiny", "--dp", "2", "-q", "-o", out).returncode == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["world_size"] = 10**12  # the Chakra reader made a set of 10**12 ranks: killed at 22.9 GB
    (out / "manifest.json").write_text(json.dumps(manifest))
    exe = shutil.which("stage") or str(__import__("pathlib").Path(sys.executable).parent / "stage")
    run = subprocess.run([exe, "validate", str(out)], capture_output=True, text=True, preexec_fn=_limit_memory)
    assert run.returncode == 1
    assert run.stderr == (f"stage: error: {out / 'manifest.json'}: world_size 1,000,000,000,000 is above the "
                          f"1,048,576 ranks STAGE reads and checks\n")
