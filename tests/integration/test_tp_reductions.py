"""Tensor-parallel reductions of SwiGLU models: one per place where partial sums meet.

Megatron's fused fc1 (gate and up in one column-parallel linear) reduces the input
gradient once; STAGE's models keep gate and up as two einsums, and propagation adds
their partial input gradients on the rank before the one reduction (REFERENCE §3:
four all-reduces of s·b·h·2 bytes per layer per micro-batch without SP, four
reduce-scatters and their all-gathers with SP).
"""

from collections import Counter

import pytest

from stage_core.flow import plan_job
from stage_core.parallel import Plan
from stage_core.trace import CollectiveType as C

S, H = 256, 4096  # llama3-8b: hidden 4096


def layer_collectives(result, layer):
    (prog,) = result.job.programs
    return [n for n in prog.nodes if n.comm_type is not None and f".layers.{layer}." in n.name]


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_swiglu_tp_without_sp_four_all_reduces_per_layer(host, micro_batches):
    result = plan_job(host, "llama3-8b", {"layers": "2"}, Plan(tp=2, seq_len=S, micro_batches=micro_batches))
    for layer in range(2):
        colls = layer_collectives(result, layer)
        assert Counter((n.comm_type, n.comm_size, n.group) for n in colls) == {
            (C.ALL_REDUCE, S * 1 * H * 2, "tp"): 4 * micro_batches}
        backward = [n.name for n in colls if ".bwd." in n.name]
        # one in backward for the MLP input (gate and up summed first), one for attention
        assert len(backward) == 2 * micro_batches
        assert sum("mlp.norm.grad_acc" in name for name in backward) == micro_batches


def test_swiglu_tp_with_sp_one_reduce_scatter_for_gate_and_up(host):
    t = 2
    result = plan_job(host, "llama3-8b", {"layers": "1"}, Plan(tp=t, sp=True, seq_len=S))
    colls = layer_collectives(result, 0)
    kinds = Counter(n.comm_type for n in colls)
    # 2 reduce-scatters forward, 2 backward; 4 all-gathers that pair with them and the
    # 2 re-gathers of the column-parallel inputs for the weight gradients (one for the
    # fused gate/up input, one for QKV: Korthikanti et al. 2022, §4.2.2)
    assert kinds == {C.REDUCE_SCATTER: 4, C.ALL_GATHER: 6}
    assert {n.comm_size for n in colls if n.comm_type == C.REDUCE_SCATTER} == {S * H * 2}
    assert {n.comm_size for n in colls if n.comm_type == C.ALL_GATHER} == {S * H * 2 // t}
