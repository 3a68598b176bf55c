"""Local (sliding-window) attention, logit soft-capping, norms over several dims, GeGLU: counted by hand."""

from __future__ import annotations

from collections import Counter

import pytest

from stage_core import sym
from stage_core.autodiff import differentiate
from stage_core.ir import GraphBuilder, blocks, kernels
from stage_core.models import evaluate_sum
from stage_core.parallel import Mesh, Plan, R, ShardedGraph, lower, propagate
from stage_core.trace import CollectiveType as C

# b=2, s=8 tokens, a=4 query heads in g=2 groups, d=2, h=8
DIMS = {"b": 2, "s": 8, "h": 8, "a": 4, "g": 2, "d": 2, "f": 12, "V": 16}
B, S, A, D = 2, 8, 4, 2


def attention(**options):
    g = GraphBuilder("attn", dims=DIMS)
    x = g.input("x", ("b", "s", "h"), dtype="bf16")
    with g.layer(0):
        out = blocks.gqa_attention(g, x, **options)
    return g.finish(g.reduce_sum(out, "bsh->b", name="loss"))


def core(graph, what, phase="forward"):
    tg = differentiate(graph) if phase != "forward" else graph
    ops = [op for op in tg.ops if op.block == "attn_core" and op.phase == phase]
    return evaluate_sum([getattr(op, what) for op in ops], DIMS)


def test_local_attention_counts_the_window_not_the_sequence():
    # each of the s = 8 queries reads 3 keys: Q·Kᵀ and P·V are 2·b·a·d·(s·3) FLOPs each
    local = attention(window=3)
    assert core(local, "matmul_flops") == 2 * (2 * B * A * D * S * 3) == 1536
    assert core(local, "other_flops") == kernels.SOFTMAX[0] * B * A * S * 3
    # against full attention over all 8 keys
    assert core(attention(), "matmul_flops") == 2 * (2 * B * A * D * S * S) == 4096
    # a window as long as the sequence, or longer, is full attention
    assert core(attention(window=8), "matmul_flops") == core(attention(window=4096), "matmul_flops") == 4096


def test_causal_local_attention_counts_the_band():
    # causal: query i reads min(i+1, 3) keys; counted as s·w − w²/2 = 24 − 4.5 = 19.5 pairs
    # (s²/2 = 32 for full causal attention, the existing convention)
    band = attention(window=3, causal_flops=True)
    assert core(band, "matmul_flops") == 2 * 2 * B * A * D * 39 // 2 == 1248
    assert core(attention(window=8, causal_flops=True), "matmul_flops") == core(
        attention(causal_flops=True), "matmul_flops") == 2 * 2 * B * A * D * 32


def test_local_attention_backward_is_five_matmuls_over_the_window():
    local = attention(window=3)
    assert core(local, "matmul_flops", "backward") == 5 * 2 * B * A * D * S * 3
    assert core(local, "other_flops", "backward") == kernels.SOFTMAX[1] * B * A * S * 3
    flash = next(op for op in differentiate(local).ops if op.fn == "flash_attention_bwd")
    assert flash.attrs["window"] == 3 and sym.evaluate(flash.letter_sizes["w"], DIMS) == 3


def test_window_keeps_memory_and_shapes():
    # FlashAttention keeps q, k, v, the output and the fp32 log-sum-exp, with or without a window
    full, local = differentiate(attention()), differentiate(attention(window=3))
    saved = lambda tg: sum(sym.evaluate(t.nbytes, DIMS) for op in tg.forward_ops for t in op.saved  # noqa: E731
                           if op.block == "attn_core")
    assert saved(full) == saved(local)


def test_classic_attention_masks_the_full_scores():
    # eager attention computes all s×s scores and masks those outside the window
    assert core(attention(kind="classic", window=3), "matmul_flops") == 4096


def test_softcap_costs_flops_per_score():
    # forward: 3 per score (divide, tanh, multiply); backward: recomputed (3) and differentiated (4)
    capped, plain = attention(softcap=50.0), attention()
    scores = B * A * S * S
    assert core(capped, "other_flops") - core(plain, "other_flops") == kernels.SOFTCAP[0] * scores == 3 * 512
    assert core(capped, "other_flops", "backward") - core(plain, "other_flops", "backward") == 7 * scores
    assert core(capped, "matmul_flops") == core(plain, "matmul_flops")
    classic = attention(kind="classic", softcap=50.0)
    assert [op.fn for op in classic.ops if op.block == "attn_core"] == ["", "softcap", "", ""]
    assert core(classic, "other_flops") - core(attention(kind="classic"), "other_flops") == 3 * scores
    # with a window the soft-cap, like the softmax, covers the window
    assert core(attention(softcap=50.0, window=3), "other_flops") == (7 + 3) * B * A * S * 3


def test_final_logit_softcap_keeps_its_output():
    g = GraphBuilder("lm", dims=DIMS)
    x, labels, wte = blocks.embed(g)
    graph = blocks.lm_head(g, x, labels, wte, softcap=30.0)
    assert [op.name for op in graph.ops] == ["embed", "final_norm", "head", "softcap", "loss"]
    cap = graph.ops[3]
    assert evaluate_sum([cap.flops], DIMS) == 3 * B * S * 16
    tg = differentiate(graph)
    assert cap.saved == cap.outputs  # dy·(1 − (y/c)²) reads the output
    (bwd,) = [op for op in tg.backward_ops if op.forward_op is cap]
    assert evaluate_sum([bwd.flops], DIMS) == 4 * B * S * 16


def test_geglu_mlp():
    g = GraphBuilder("mlp", dims=DIMS)
    x = g.input("x", ("b", "s", "h"), dtype="bf16")
    graph = g.finish(g.reduce_sum(blocks.swiglu_mlp(g, x, act="geglu"), "bsh->b", name="loss"))
    assert [op.name for op in graph.ops] == ["mlp.gate", "mlp.up", "mlp.geglu", "mlp.down", "loss"]
    assert evaluate_sum([graph.ops[2].flops], DIMS) == 10 * B * S * 12
    with pytest.raises(ValueError, match="reglu"):
        blocks.swiglu_mlp(g, x, act="reglu")


# ---------------------------------------------------------------------- norms over several dims
def test_norm_over_all_heads_has_weights_of_the_whole_width():
    graph = attention(qk_norm="rmsnorm", qk_norm_span="all")
    params = {p.name: tuple(sym.evaluate(e, DIMS) for e in p.shape) for p in graph.params}
    assert params["layers.0.attn.q_norm.weight"] == (2, 2, 2)  # [g, a/g, d]: a·d = 8 values
    assert params["layers.0.attn.k_norm.weight"] == (2, 2)  # [g, d]
    qn = next(op for op in graph.ops if op.name.endswith("q_norm"))
    assert qn.whole == frozenset("cde") and evaluate_sum([qn.flops], DIMS) == 4 * B * S * A * D
    tg = differentiate(graph)
    (bwd,) = [op for op in tg.backward_ops if op.forward_op is qn]
    assert bwd.outputs[1].grad_of.name == "layers.0.attn.q_norm.weight"
    assert bwd.linear_reduce == frozenset("ab")  # the weight gradient sums over tokens only


def test_norm_over_all_heads_under_tensor_parallel_all_reduces_row_statistics():
    graph = attention(qk_norm="rmsnorm", qk_norm_span="all")
    plan = Plan(tp=2)
    sg = ShardedGraph(differentiate(graph), {a: plan.degree(a) for a in ("tp", "cp", "dp", "pp", "ep")})
    sg.shard_params("tp", ("g",))
    low = lower(propagate(sg), plan, Mesh.from_plan(plan), DIMS)
    norm_colls = [n for n in low.programs[0].nodes if n.comm_type is not None and "_norm" in n.name]
    # q_norm and k_norm, forward and backward: one all-reduce of the fp32 sum of squares per token
    assert Counter((n.comm_type, n.comm_size) for n in norm_colls) == {(C.ALL_REDUCE, 4 * B * S): 4}
    assert not any(n.comm_type == C.ALL_GATHER for n in low.programs[0].nodes if n.comm_type is not None)


def test_gated_grouped_norm():
    # Mamba-2's norm: rmsnorm(y·silu(z)) over each group's r·p values, a weight per group
    g = GraphBuilder("gn", dims={"b": 2, "s": 3, "G": 2, "r": 2, "p": 4})
    y = g.input("y", ("b", "s", "G", "r", "p"), dtype="bf16")
    z = g.input("z", ("b", "s", "G", "r", "p"), dtype="bf16")
    w = g.param("norm.weight", ("G", "r", "p"))
    out = g.norm("gated_rmsnorm", y, w, gate=z, over=2, name="norm")
    graph = g.finish(g.reduce_sum(out, "bsGrp->b", name="loss"))
    op = graph.ops[0]
    assert op.spec == "abcde,abcde,cde->abcde" and op.whole == frozenset("de")
    assert evaluate_sum([op.flops], {"b": 2, "s": 3, "G": 2, "r": 2, "p": 4}) == 9 * 2 * 3 * 16
    with pytest.raises(ValueError, match="gate"):
        g.norm("rmsnorm", y, w, gate=z, over=2)
