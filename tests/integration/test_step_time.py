"""Sets timed on a GPU: the durations reach the files and the real simulator replays them."""

import json

import pytest

from stage_adapter_chakra import etread
from stage_core import hardware
from stage_core.api import plan_job, write_trace_set
from stage_core.parallel import Plan
from stage_core.trace import NodeType


@pytest.fixture(scope="module")
def timed_set(host, tmp_path_factory):
    gpu = hardware.resolve(host, "a100")
    result = plan_job(host, "gpt2", {"layers": "4"}, Plan(pp=2, tp=2, dp=2, micro_batches=4, seq_len=256), gpu)
    out = tmp_path_factory.mktemp("timed") / "set"
    write_trace_set(host, result, out)
    return out


def test_durations_reach_the_files_and_add_up_to_the_manifest(timed_set):
    manifest = json.loads((timed_set / "manifest.json").read_text())
    assert manifest["compute_model"] == "calibrated" and manifest["hardware"]["name"] == "a100"
    per_class = {tuple(rc["ranks"]): rc["compute_time_us"] for rc in manifest["rank_classes"]}
    for rank, nodes in etread.read(timed_set).iter_ranks():
        total = sum(n.duration_micros for n in nodes if n.type == NodeType.COMP)
        assert total == next(us for ranks, us in per_class.items() if rank in ranks)
        assert total > 0


def test_the_simulator_replays_the_durations(timed_set, simulate):
    status, results = simulate(timed_set, system=None)  # the hardware the set was timed for
    assert status == 0 and results["summary"]["deadlocked_ranks"] == []
    assert results["system"] == "preset a100"
    system = json.loads((timed_set / "astrasim" / "system.json").read_text())
    assert system["roofline-enabled"] == 0
    manifest = json.loads((timed_set / "manifest.json").read_text())
    zero = {}
    for rank, nodes in etread.read(timed_set).iter_ranks():
        # ASTRA-sim replays duration x 1000 ns and charges 1 ns for a duration of 0
        zero[rank] = sum(1 for n in nodes if n.type == NodeType.COMP and n.duration_micros == 0)
    for row in results["ranks"]:
        rc = next(c for c in manifest["rank_classes"] if row["rank"] in c["ranks"])
        assert row["gpu_time_ns"] == rc["compute_time_us"] * 1000 + zero[row["rank"]]
