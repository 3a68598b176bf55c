"""MoE layers under parallel plans: routed tokens, capacity, tensor and expert parallel.

Numbers come from hand computations: a dropless expert processes its tokens·k/E share
of the routed rows (whole rows: some experts one more than others, the total exactly
tokens·k); with a capacity factor every expert is padded to Megatron's capacity
⌈tokens·k·cf/E⌉ of each rank's tokens; a SwiGLU expert costs 3 matmuls of 2·h·fe
FLOPs per row forward and twice that backward.
"""

import math

import pytest

from stage_core.api import plan_job
from stage_core.parallel import Plan

MIXTRAL = {"h": 4096, "fe": 14336, "E": 8, "k": 2}
DEEPSEEK = {"h": 7168, "fe": 2048, "E": 256, "k": 8}


def expert_matmul_flops(result):
    """Matmul FLOPs of the routed experts' kernels on the first rank class."""
    (prog, *_) = result.job.programs
    return sum(n.num_ops for n in prog.nodes if n.comm_type is None and ".moe.experts." in n.name
               and n.flops_kind == "matmul")


def swiglu_expert_flops(rows, m):
    # gate, up, down: 2·rows·h·fe each forward; backward twice forward
    return 3 * 3 * 2 * rows * m["h"] * m["fe"]


@pytest.mark.parametrize("model,m,seq,dense", [("mixtral-8x7b", MIXTRAL, 1001, 0), ("deepseek-v3", DEEPSEEK, 1000, 3)])
def test_any_sequence_length_routes_whole_tokens(host, model, m, seq, dense):
    # 1001·2/8 and 1000·8/256 are not whole: experts get floor or ceiling shares, the
    # total is exactly tokens·k rows per MoE layer
    result = plan_job(host, model, {"layers": str(dense + 2)}, Plan(seq_len=seq))
    assert expert_matmul_flops(result) == 2 * swiglu_expert_flops(seq * m["k"], m)


@pytest.mark.parametrize("dp", [1, 2])
def test_capacity_factor_pads_every_expert_to_megatrons_rounded_up_capacity(host, dp):
    seq, cf, m = 1001, 1.1, MIXTRAL
    result = plan_job(host, "mixtral-8x7b", {"layers": "1", "capacity_factor": str(cf)},
                      Plan(seq_len=seq, dp=dp))
    capacity = math.ceil(seq * m["k"] * cf / m["E"])  # 276, from each rank's own 1001 tokens
    assert capacity == 276
    assert expert_matmul_flops(result) == swiglu_expert_flops(m["E"] * capacity, m)


def test_moe_tp_with_sp_at_micro_batch_one(host, write_set, simulate):
    # the slots split over tp follow the sequence (SP), not the micro-batch of 1
    plan = Plan(tp=2, sp=True, seq_len=256, micro_batch_size=1)
    result = plan_job(host, "mixtral-8x7b", {"layers": "2"}, plan)
    whole = plan_job(host, "mixtral-8x7b", {"layers": "2"}, Plan(seq_len=256))
    (rc,) = result.manifest["rank_classes"]
    (one,) = whole.manifest["rank_classes"]
    assert 2 * rc["flops"]["matmul"] == one["flops"]["matmul"]
    out = write_set("mixtral-8x7b", plan, layers=2)
    status, results = simulate(out)
    assert results["summary"]["finished_ranks"] == 2 and status == 0
