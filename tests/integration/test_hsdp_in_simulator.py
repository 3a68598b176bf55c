"""Hybrid sharding (stage-strategy-hsdp, an axis of its own carved out of dp) in the real simulator:
shard group 8 of dp 64, and with tensor and pipeline parallel around it, every rank finishes in
ASTRA-sim and in the replay; each rank's collective bytes (as the manifest states them and `stage
validate` recomputes them from the files) are the ones worked out by hand."""

from __future__ import annotations

import json

import pytest

from stage_core.flow import plan_job, write_trace_set
from stage_core.hardware import resolve
from stage_core.models import param_counts
from stage_core.parallel.plan import Plan

LLAMA = ("llama3-8b", {"layers": "2", "vocab_size": "32000"})


@pytest.mark.parametrize("plan", [
    Plan(dp=64, micro_batches=2, seq_len=1024),
    Plan(dp=16, tp=2, pp=2, sp=True, micro_batches=4, seq_len=1024),
], ids=["dp64-group8", "tp2-dp16-group8-pp2"])
def test_hybrid_sharding_finishes_on_every_rank(host, tmp_path, plan, replay_and_simulate):
    result = plan_job(host, *LLAMA, plan.with_options(shard_group=8), resolve(host, "h100"))
    assert result.manifest["plan"]["axes"] == {"dps": 8, "dpr": plan.dp // 8}
    target = write_trace_set(host, result, tmp_path / "set")
    verdict, status, got = replay_and_simulate(target)
    assert verdict.finishes and status == 0 and got["summary"]["finished_ranks"] == plan.world_size
    groups = json.loads((target / "comm_groups.json").read_text())
    sizes = {len(m) for m in groups.values()}
    assert {8, plan.dp // 8} <= sizes  # the shard groups and the replica groups


def test_shard_group_8_of_dp_64_moves_the_bytes_worked_by_hand(host):
    m, n = 2, 8
    result = plan_job(host, *LLAMA, Plan(dp=64, micro_batches=m, seq_len=1024).with_options(shard_group=n))
    psi = param_counts(result.forward)[0]
    padded = -(-psi // n) * n
    (rc,) = result.manifest["rank_classes"]
    # REFERENCE §3, each rank: the bf16 gradients reduce-scattered in the group once, the shard all-reduced
    # across the 8 replicas, every unit (2 layers, embedding, head) gathered before each micro-batch's
    # forward and backward: 2m gathers of the rank's shard of every parameter
    assert rc["comm_bytes"]["reduce_scatter"] == 2 * padded
    assert rc["comm_bytes"]["all_reduce"] == 2 * padded // n
    assert rc["comm_bytes"]["all_gather"] == 2 * m * (2 * psi // n)
    assert rc["memory_bytes"]["parameters"] + rc["memory_bytes"]["gradients"] + rc["memory_bytes"]["optimizer"] \
        == 2 * psi // n + 14 * padded // n
