"""Hybrid sharding by hand (REFERENCE §2 and §3 of STAGE's team documents, ZeRO's and the ring
collectives' formulas): shard-group 8 of dp 64, per rank memory and bytes, the groups each
collective runs in, refusals; the kit."""

from __future__ import annotations

import pytest

from stage_core.api import CollectiveType as C
from stage_core.api import NodeType, Plan, UsageError, param_counts, plan_job
from stage_core.testing import assert_strategy_conserves, fresh_host, jsonl_plugin, reference_strategies, toy_plugin

from stage_strategy_hsdp import plugin

HOST = fresh_host((plugin, "hsdp"), (toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"))
GB = 1e9
# a 7.5B-parameter GPT shape (Narayanan et al.'s 7.5B: h 4096, 36 layers, V 51200), ZeRO's example
GPT_7B5 = {"layers": "36", "hidden": "4096", "heads": "32", "ffn": "16384", "vocab": "51200", "seq_len": "16"}


def memory(plan, overrides):
    (rc,) = plan_job(HOST, "toy", overrides, plan, programs=False).manifest["rank_classes"]
    return rc["memory_bytes"]


def test_model_state_of_shard_group_8_of_dp_64():
    # ZeRO-3 inside groups of 8: (2 + 2 + 12)·Ψ/8 per rank, whatever dp is; Ψ = 7.5B -> 15 GB, between
    # plain data parallel's 16Ψ = 120 GB and ZeRO-3 over all 64 ranks' 16Ψ/64 = 1.9 GB (ZeRO's table)
    psi = memory(Plan(dp=64), GPT_7B5)["parameters"] // 2
    mem = memory(Plan(dp=64).with_options(shard_group=8), GPT_7B5)
    padded = -(-psi // 8) * 8
    assert mem["parameters"] == 2 * psi // 8
    assert (mem["gradients"], mem["optimizer"]) == (2 * padded // 8, 12 * padded // 8)
    state = mem["parameters"] + mem["gradients"] + mem["optimizer"]
    assert state == pytest.approx(16 * psi / 8, rel=1e-9)
    assert state / GB == pytest.approx(16 * 7.5 / 8, rel=0.01)  # 15 GB
    assert memory(Plan(dp=64).with_options(shard_group=8), GPT_7B5) == memory(
        Plan(dp=16).with_options(shard_group=8), GPT_7B5)  # the replicas' count does not matter


def collectives(result, rank=0):
    (program,) = result.job.programs
    out = []
    for node in program.nodes:
        if node.type == NodeType.COMM_COLL:
            out.append((node.comm_type, node.comm_size, result.job.comm_groups[result.job.group_name(rank, node.group)],
                        node.group))
    return out


@pytest.mark.parametrize("m", [1, 2])
def test_bytes_and_groups_of_shard_group_8_of_dp_64(m):
    dp, n = 64, 8
    result = plan_job(HOST, "toy", {"layers": "2"}, Plan(dp=dp, micro_batches=m).with_options(shard_group=n))
    psi = param_counts(result.forward)[0]
    padded = -(-psi // n) * n
    colls = collectives(result)
    group = list(range(8))  # rank 0's shard group: its 8 neighbours in dp (one node of 8 GPUs)
    replicas = list(range(0, 64, 8))  # one rank of each of the 8 groups
    rs = [c for c in colls if c[0] == C.REDUCE_SCATTER]
    ar = [c for c in colls if c[0] == C.ALL_REDUCE]
    ag = [c for c in colls if c[0] == C.ALL_GATHER]
    assert {tuple(c[2]) for c in rs} == {tuple(group)} == {tuple(c[2]) for c in ag}
    assert {tuple(c[2]) for c in ar} == {tuple(replicas)}
    assert sum(c[1] for c in rs) == 2 * padded  # the bf16 gradients (ASTRA-sim's size: the input), once
    assert sum(c[1] for c in ar) == 2 * padded // n  # the shard, across the replicas
    # each unit (2 layers, the embedding and head) gathered before each micro-batch's forward and backward
    assert len(ag) == 2 * m * 3 and sum(c[1] for c in ag) == 2 * m * (2 * psi // n)
    # ring volume per rank (REFERENCE §3): RS (n-1)/n·2Ψ, AR 2(r-1)/r of the shard, AG (n-1)/n·2Ψ each time
    r = dp // n
    volume = (n - 1) / n * 2 * padded + 2 * (r - 1) / r * 2 * padded / n + 2 * m * (n - 1) / n * 2 * psi
    got = sum((n - 1) / n * c[1] for c in rs) + sum(2 * (r - 1) / r * c[1] for c in ar) + sum(
        (n - 1) / n * c[1] * n for c in ag)
    assert got == pytest.approx(volume)
    # against plain data parallel's all-reduce 2(dp-1)/dp·2Ψ: what leaves the group of 8 is the shard's
    # all-reduce only, 1/8 of the gradient bytes
    assert sum(c[1] for c in ar) / (2 * padded) == pytest.approx(1 / n)


def test_shard_group_equal_to_dp_is_zero_3_over_dp():
    # one group of all dp ranks: no replica to all-reduce over, the reduce-scatter and gathers over dp
    result = plan_job(HOST, "toy", {"layers": "2"}, Plan(dp=8).with_options(shard_group=8))
    colls = collectives(result)
    assert {c[0] for c in colls} == {C.REDUCE_SCATTER, C.ALL_GATHER}
    assert {tuple(c[2]) for c in colls} == {tuple(range(8))}
    assert {c[3] for c in colls} == {"dp"}  # the shard group is dp's: the same group ids


@pytest.mark.parametrize("plan,message", [
    (Plan(dp=64).with_options(shard_group=6),
     "--shard-group 6: the dps axis is carved out of dp (--dp 64); it must divide 64 (valid: 1, 2, 4, 8, 16, 32, 64)"),
    (Plan(dp=8, task="prefill").with_options(shard_group=4),
     "--shard-group 4: hybrid sharding shards training state (gradients, optimizer); --task prefill has no "
     "backward (use --task train)"),
])
def test_refusals_are_one_line(plan, message):
    with pytest.raises(UsageError) as err:
        plan_job(HOST, "toy", {"layers": "2"}, plan)
    assert str(err.value) == message


def test_with_zero_or_experts_it_refuses():  # (stage-parallel provides --zero and --ep: its validate alone here)
    from stage_strategy_hsdp.strategy import validate

    assert validate(None, Plan(dp=8, zero=1, ep=2).with_options(shard_group=4)) == [
        "--shard-group 4 with --zero 1: hybrid sharding shards the model state itself (ZeRO-3 inside each group "
        "of 4); leave --zero out",
        "--shard-group 4 with --ep 2: the experts' data-parallel group is another view of the ranks, which hybrid "
        "sharding does not split; leave one out"]


def test_the_kit():
    plans = [Plan(dp=4), Plan(dp=8, micro_batches=2), Plan(dp=4, pp=2, micro_batches=4)]
    assert assert_strategy_conserves(HOST, "hsdp", plans=plans, option=("shard-group", 2)) == 3


def test_every_rank_finishes_in_the_replay(tmp_path):
    from stage_core.api import examine_trace_set, read_trace_set, write_trace_set

    plan = Plan(dp=16, pp=2, micro_batches=4).with_options(shard_group=4)
    result = plan_job(HOST, "toy", {"layers": "4"}, plan)
    report = examine_trace_set(read_trace_set(HOST, write_trace_set(HOST, result, tmp_path / "set", "jsonl")))
    assert report.problems == [] and report.verdict.finishes
