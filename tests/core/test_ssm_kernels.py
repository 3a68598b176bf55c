"""The state-space kernels (GraphBuilder.causal_conv1d, .ssd_scan) and squared ReLU, counted by hand."""

from __future__ import annotations

import pytest

from stage_core.autodiff import differentiate
from stage_core.ir import GraphBuilder, kernels
from stage_core.models import evaluate_sum
from stage_core.parallel import Mesh, Plan, ShardedGraph, lower, propagate

# b=2, s=8 tokens in chunks of Q=4; G=2 groups of r=2 heads, head dim P=3, state N=5; k=3 taps
DIMS = {"b": 2, "s": 8, "G": 2, "r": 2, "P": 3, "N": 5, "c": 13, "k": 3}
B, S, Q, G, H, P, N = 2, 8, 4, 2, 4, 3, 5


def scan_graph():
    g = GraphBuilder("ssd", dims=DIMS)
    xbc = g.input("xbc", ("b", "s", "G", "c"), dtype="bf16")
    dt = g.input("dt", ("b", "s", "G", "r"), dtype="bf16")
    xbc, _conv_state = g.causal_conv1d(xbc, g.param("conv.weight", ("G", "c", "k")), g.param("conv.bias", ("G", "c")))
    x, b, c = g.split(xbc, "bsgc->bsgrp,bsgn,bsgn", (("b", "s", "G", "r", "P"), ("b", "s", "G", "N"),
                                                        ("b", "s", "G", "N")))
    y, _state = g.ssd_scan(x, dt, g.param("A_log", ("G", "r"), dtype="fp32"), b, c, g.param("D", ("G", "r"), dtype="fp32"),
                   g.param("dt_bias", ("G", "r")), chunk=Q)
    return g.finish(g.reduce_sum(y, "bsgrp->b", name="loss"))


def op(graph, fn):
    (found,) = [o for o in graph.ops if o.fn == fn]
    return found


def test_ssd_matmuls_follow_the_papers_four_steps():
    ssd = op(scan_graph(), "ssd_scan")
    # C·Bᵀ per group 2·Q·N·G, (L∘C·Bᵀ)·x per head 2·Q·P·H, chunk states and outputs 2·N·P·H each
    assert evaluate_sum([ssd.matmul_flops], DIMS) == B * S * (2 * Q * N * G + 2 * Q * P * H + 4 * N * P * H)
    other = B * S * (kernels.SSD_DT[0] * H + kernels.SSD_MASK[0] * Q * H + kernels.SSD_OUT[0] * H * P) \
        + kernels.SSD_PASS[0] * B * (S // Q) * H * P * N
    assert evaluate_sum([ssd.other_flops], DIMS) == other
    assert ssd.whole == frozenset("s")  # the scan runs along the whole sequence
    assert ssd.outputs[1].dtype == "fp32"  # dA_cumsum


def test_ssd_backward_is_twice_the_forward_plus_the_recomputed_products():
    tg = differentiate(scan_graph())
    ssd, bwd = op(tg, "ssd_scan"), op(tg, "ssd_scan_bwd")
    fwd_mm = evaluate_sum([ssd.matmul_flops], DIMS)
    recomputed = B * S * (2 * Q * N * G + 2 * N * P * H)  # C·Bᵀ and the chunk states
    assert evaluate_sum([bwd.matmul_flops], DIMS) == 2 * fwd_mm + recomputed
    assert {t.name for t in ssd.saved} == {"split:0", "dt", "A_log", "split:1", "split:2", "D", "dt_bias", "ssd:0",
                                           "ssd:1"}
    # every parameter gets its gradient
    assert {p.name for p in tg.grads} == {"conv.weight", "conv.bias", "A_log", "D", "dt_bias"}


def test_conv_by_hand():
    tg = differentiate(scan_graph())
    conv, bwd = op(tg, "causal_conv1d"), op(tg, "causal_conv1d_bwd")
    elements = B * S * G * 13
    assert evaluate_sum([conv.flops], DIMS) == elements * (2 * 3 + 5)
    assert evaluate_sum([bwd.flops], DIMS) == elements * (6 * 3 + 11)
    assert conv.saved == conv.inputs  # the input; backward recomputes the conv
    with pytest.raises(ValueError, match="weight"):
        g = GraphBuilder("bad", dims=DIMS)
        g.causal_conv1d(g.input("x", ("b", "s", "c"), dtype="bf16"), g.param("w", ("G", "c", "k")),
                        g.param("b", ("c",)))


def test_fractional_byte_coefficients_lower_exactly():
    # the chunk states cost 16/Q bytes per state element and token: lowering multiplies exactly
    graph = scan_graph()
    ssd = op(graph, "ssd_scan")
    by_hand = B * S * (3 * 2 * H * P + (2 + 24) * H + 4 * 2 * G * N + 2 * 2 * G * Q) + 16 * B * (S // Q) * H * P * N
    assert evaluate_sum([ssd.bytes], DIMS) == by_hand
    plan = Plan(seq_len=S, micro_batch_size=B)
    tg = differentiate(graph)
    low = lower(propagate(ShardedGraph(tg, {"tp": 1, "cp": 1, "dp": 1, "pp": 1, "ep": 1})), plan,
                Mesh.from_plan(plan), DIMS)
    (node,) = [n for n in low.programs[0].nodes if n.name.endswith(".ssd")]
    assert node.tensor_size == by_hand


def test_relu2():
    g = GraphBuilder("r", dims={"b": 2, "s": 3, "f": 4, "e": 4})
    x = g.einsum("bsf,fe->bse", g.input("x", ("b", "s", "f"), dtype="bf16"), g.param("w", ("f", "f")), name="mm")
    y = g.elementwise("relu2", x)
    tg = differentiate(g.finish(g.reduce_sum(y, "bse->b", name="loss")))
    fwd, bwd = op(tg, "relu2"), op(tg, "relu2_bwd")
    assert evaluate_sum([fwd.flops], {"b": 2, "s": 3, "f": 4}) == 2 * 24
    assert evaluate_sum([bwd.flops], {"b": 2, "s": 3, "f": 4}) == 2 * 24
    assert fwd.saved == (x,)
