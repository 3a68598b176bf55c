"""Sets timed on a GPU: the durations reach the files and the real simulator replays them."""

import json

import pytest

from stage_adapter_chakra import etread
from stage_core import hardware
from stage_core.flow import plan_job, write_trace_set
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
    assert manifest["compute_model"] == "shaped" and manifest["hardware"]["name"] == "a100"
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


@pytest.mark.parametrize("preset,within", [("a100-calibrated", 0.01), ("a100", 0.10)])
def test_the_a100_presets_on_table_1s_compute_bound_row(host, preset, within):
    """Narayanan et al. 2021, Table 1: GPT 1.7B on 32 A100s (dp32, batch 512, full recompute)
    ran at 137 TFLOP/s per GPU, counting every matmul FLOP with recompute.  The row has no
    tensor or pipeline parallelism, so its step is the compute of one GPU (micro-batch 4
    assumed).  The a100-calibrated preset's gemm_efficiency was fitted to this row; the a100
    preset's kernels are fitted to measured kernel times only, and the row judges them."""
    plan = Plan(dp=32, micro_batch_size=4, micro_batches=4, recompute="full")
    result = plan_job(host, "megatron-1.7b", {}, plan, hardware.resolve(host, preset))
    (rc,) = result.manifest["rank_classes"]
    c, p = result.manifest["model"], result.manifest["plan"]
    B, s, L, h, V = p["global_batch"], p["seq_len"], c["layers"], c["hidden"], 51200
    table1 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)) / 32  # per GPU, the paper's count
    assert rc["flops"]["matmul"] == pytest.approx(table1, rel=1e-9)
    assert table1 / (rc["compute_time_us"] * 1e-6) / 1e12 == pytest.approx(137, rel=within)
