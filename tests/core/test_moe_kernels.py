"""The MoE kernels of the core (router, dispatch, combine), concat, sigmoid and flash
attention with its own value head dim: FLOPs and bytes against hand-computed small
cases, and their backward rules."""

from __future__ import annotations

import pytest

from stage_core import sym
from stage_core.autodiff import differentiate, saved_activations
from stage_core.ir.builder import GraphBuilder
from stage_core.ir.ops import BACKWARD

# tokens b·s = 2·3 = 6, hidden 4, E = 4 experts, k = 2 per token, expert width 6
DIMS = dict(b=2, s=3, h=4, E=4, k=2, f=6, V=8)


def moe_graph(score="softmax", normalize=True, scale=1, selection_bias=False, capacity_factor=None):
    g = GraphBuilder("moe", dims={k: v for k, v in DIMS.items() if k not in "bs"},
                     meta={"experts": 4, "experts_per_token": 2})
    tokens = g.input("tokens", ("b", "s"))
    labels = g.input("labels", ("b", "s"))
    wte = g.param("wte", ("V", "h"))
    x = g.embedding(tokens, wte)
    logits = g.einsum("bsh,he->bse", x, g.param("router.weight", ("h", "E")), name="logits")
    w = g.router(logits, k="k", score=score, normalize=normalize, scale=scale, selection_bias=selection_bias,
                 name="router")
    xe = g.dispatch(x, w, k="k", capacity_factor=capacity_factor, name="dispatch")
    u = g.einsum("ech,ehf->ecf", xe, g.param("w1", ("E", "h", "f"), tags=("expert",)), name="fc1")
    ye = g.einsum("ecf,efh->ech", u, g.param("w2", ("E", "f", "h"), tags=("expert",)), name="fc2")
    y = g.combine(ye, w, k="k", name="combine")
    loss = g.cross_entropy(g.einsum("bsh,vh->bsv", y, wte, name="head"), labels)
    return g.finish(loss)


def op_named(graph, name):
    (op,) = [op for op in graph.ops if op.name == name]
    return op


def ev(e, **extra):
    return sym.evaluate(e, {**DIMS, **extra})


# ---------------------------------------------------------------------- router
def test_router_softmax_flops_and_bytes():
    op = op_named(moe_graph(), "router")
    # per score (6 tokens × 4 experts = 24): softmax 5 + top-k 1; per selected weight
    # (6 × 2 = 12): renormalise 2
    assert ev(op.flops) == 24 * 6 + 12 * 2 == 168
    assert ev(op.matmul_flops) == 0
    # bf16 logits read, fp32 weights and fp32 scores written: 24·2 + 24·4 + 24·4
    assert ev(op.bytes) == 240
    weights, scores = op.outputs
    assert weights.dtype == scores.dtype == "fp32"
    assert [str(d) for d in weights.shape] == ["b", "s", "E"]
    assert op.whole == frozenset({"e"})


def test_router_sigmoid_bias_scale_flops():
    op = op_named(moe_graph(score="sigmoid", selection_bias=True, scale=2.5), "router")
    # per score: sigmoid 3 + top-k 1 + selection bias 1 = 5 (×24); per selected (×12):
    # renormalise 2 + scale 1
    assert ev(op.flops) == 24 * 5 + 12 * 3 == 156
    assert op.attrs["scale"] == sym.expr(5) / 2


def test_router_backward_flops():
    tg = differentiate(moe_graph())
    op = op_named(tg, "router.bwd")
    # softmax backward 4 per score (×24) + renormalisation backward 3 per selected (×12)
    assert ev(op.flops) == 24 * 4 + 12 * 3 == 132
    tg = differentiate(moe_graph(score="sigmoid", selection_bias=True, scale=2.5))
    # sigmoid backward 3 (×24) + renormalisation 3 and scale 1 per selected (×12)
    assert ev(op_named(tg, "router.bwd").flops) == 24 * 3 + 12 * 4 == 120


# ---------------------------------------------------------------------- dispatch
def test_dispatch_is_a_copy_with_exact_capacity():
    op = op_named(moe_graph(), "dispatch")
    (out,) = op.outputs
    # dropless: c = b·s·k/E = 6·2/4 = 3 slots per expert
    assert [ev(d) for d in out.shape] == [4, 3, 4]
    assert ev(op.flops) == 0
    # k rows read per token (2·6·4·2 bytes) + E·c rows written (4·3·4·2) + k int32 indices per token (4·2·6)
    assert ev(op.bytes) == 96 + 96 + 48 == 240
    assert op.attrs["token_letters"] == "bs" and op.attrs["slot_letter"] == "c"
    assert op.attrs["expert_letter"] == "e" and op.attrs["dropless"] is True


def test_dispatch_capacity_factor():
    op = op_named(moe_graph(capacity_factor=1.5), "dispatch")
    # c = b·s·k·cf/E: with b=2, s=4: 8·2·1.5/4 = 6
    assert ev(op.outputs[0].shape[1], s=4) == 6
    assert op.attrs["capacity_factor"] == sym.expr(3) / 2
    # the expert matmul runs over all E·c slots: 2·E·c·h·f = 2·4·6·4·6
    assert ev(op_named(moe_graph(capacity_factor=1.5), "fc1").flops, s=4) == 1152


def test_dispatch_backward():
    tg = differentiate(moe_graph())
    op = op_named(tg, "dispatch.bwd")
    # sums each token's k = 2 slot gradients: k - 1 = 1 add per element of [b, s, h] (24)
    assert ev(op.flops) == 24
    # k rows read (96) + the token rows written (48) + indices (48)
    assert ev(op.bytes) == 192
    assert [t.grad_of.name for t in op.outputs] == ["embedding"]


# ---------------------------------------------------------------------- combine
def test_combine_flops_and_bytes():
    op = op_named(moe_graph(), "combine")
    # multiply and add per element of the k·b·s·h = 2·6·4 = 48 combined rows
    assert ev(op.flops) == 2 * 48 == 96
    # rows read (48·2) + k fp32 weights and int32 indices per token (2·8·6) + output written (24·2)
    assert ev(op.bytes) == 96 + 96 + 48 == 240


def test_combine_backward():
    tg = differentiate(moe_graph())
    op = op_named(tg, "combine.bwd")
    # d out = w·dy (1) and d w = dy·out summed over h (2), per element of the 48 rows
    assert ev(op.flops) == 3 * 48 == 144
    assert [t.grad_of.name for t in op.outputs] == ["fc2", "router:0"]


def test_moe_backward_exists_and_router_gets_a_gradient():
    fwd = moe_graph()
    tg = differentiate(fwd)
    kernels = {op.fn for op in tg.ops if op.phase == BACKWARD}
    assert {"moe_router_bwd", "moe_dispatch_bwd", "moe_combine_bwd"} <= kernels
    names = {p.name for p in tg.grads}
    assert {"router.weight", "w1", "w2", "wte"} <= names
    # backward reads: the routing weights (dispatch, combine, router), the router scores,
    # the expert outputs (combine)
    saved = {t.name for t in saved_activations(tg)}
    assert {"router:0", "router:1", "fc2"} <= saved
    # expert einsums: backward is twice forward
    for name in ("fc1", "fc2"):
        fwd_flops = ev(op_named(tg, name).flops)
        bwd = [op for op in tg.ops if op.forward_op is op_named(tg, name) and op.kind == "einsum"]
        assert sum(ev(op.flops) for op in bwd) == 2 * fwd_flops


# ---------------------------------------------------------------------- sigmoid, concat
def test_sigmoid_kernel():
    g = GraphBuilder("sig", dims={"h": 4})
    x = g.param("x", ("b", "h"))
    y = g.elementwise("sigmoid", x, name="sig")
    loss = g.reduce_sum(y, "bh->b", name="loss")
    tg = differentiate(g.finish(loss))
    assert sym.evaluate(op_named(tg, "sig").flops, {"b": 2, "h": 4}) == 3 * 8
    assert sym.evaluate(op_named(tg, "sig.bwd").flops, {"b": 2, "h": 4}) == 6 * 8


def test_concat_with_broadcast_backward():
    # MLA's key: per-head part [b,s,a,n] joined with a shared part [b,s,p] broadcast to every head
    g = GraphBuilder("cat", dims={"a": 3, "n": 4, "p": 5})
    kn = g.param("kn", ("b", "s", "a", "n"))
    kp = g.param("kp", ("b", "s", "p"))
    k = g.concat([kn, kp], "bsan,bsp->bsaz", ("b", "s", "a", sym.dim("n") + sym.dim("p")), name="join")
    loss = g.reduce_sum(k, "bsaz->bs", name="loss")
    tg = differentiate(g.finish(loss))
    vals = {"b": 1, "s": 2, "a": 3, "n": 4, "p": 5}
    join = op_named(tg, "join")
    assert join.kind == "view" and join.fn == "concat" and sym.evaluate(join.flops, vals) == 0
    grads = {p.name: g_ for p, g_ in tg.grads.items()}
    assert [sym.evaluate(d, vals) for d in grads["kn"].shape] == [1, 2, 3, 4]
    assert [sym.evaluate(d, vals) for d in grads["kp"].shape] == [1, 2, 5]
    (reduce_op,) = [op for op in tg.ops if op.forward_op is join and op.kind == "reduction"]
    # the shared part's gradient: its b·s·a·p = 1·2·3·5 slice summed over the a heads
    assert sym.evaluate(reduce_op.flops, vals) == 30
    assert reduce_op.linear_reduce == frozenset({"a"})


def test_concat_rejects_wrong_sizes():
    g = GraphBuilder("cat", dims={"n": 4, "p": 5})
    x = g.param("x", ("b", "n"))
    y = g.param("y", ("b", "p"))
    with pytest.raises(ValueError, match="sum to"):
        g.concat([x, y], "bn,bp->bz", ("b", 10), name="join")


# ---------------------------------------------------------------------- flash attention, value head dim
def flash_graph(dv):
    g = GraphBuilder("fa", dims={"g": 2, "d": 3, "w": 5})
    q = g.param("q", ("b", "s", "g", 1, "d"))
    k = g.param("k", ("b", "s", "g", "d"))
    v = g.param("v", ("b", "s", "g", dv))
    o = g.flash_attention(q, k, v, name="fa")
    loss = g.reduce_sum(o, "bsgrv->b", name="loss")
    return differentiate(g.finish(loss))


def test_flash_attention_separate_value_dim():
    vals = {"b": 1, "s": 4, "g": 2, "d": 3, "w": 5}
    tg = flash_graph("w")
    fwd = op_named(tg, "fa")
    assert fwd.attrs.get("separate_value_dim") is True
    assert [sym.evaluate(d, vals) for d in fwd.outputs[0].shape] == [1, 4, 2, 1, 5]
    # Q·Kᵀ 2·b·s·g·r·d·s = 2·1·4·2·1·3·4 = 192; P·V over dv = 5: 320; softmax 7·b·g·r·s·s = 224
    assert sym.evaluate(fwd.flops, vals) == 192 + 320 + 224
    assert sym.evaluate(fwd.matmul_flops, vals) == 512
    # backward: recomputed Q·Kᵀ, dQ, dK over d (3·192); dV, dP over dv (2·320); softmax bwd 4·32
    bwd = op_named(tg, "fa.bwd")
    assert sym.evaluate(bwd.flops, vals) == 3 * 192 + 2 * 320 + 4 * 32
    assert [sym.evaluate(d, vals) for d in bwd.outputs[2].shape] == [1, 4, 2, 5]


def test_flash_attention_unchanged_without_value_dim():
    vals = {"b": 1, "s": 4, "g": 2, "d": 3}
    tg = flash_graph("d")
    fwd, bwd = op_named(tg, "fa"), op_named(tg, "fa.bwd")
    assert "separate_value_dim" not in fwd.attrs
    assert fwd.spec == "bsgrd,bkgd,bkgd->bsgrd,bgrs"
    assert bwd.spec == "bsgrd,bsgrd,bkgd,bkgd,bsgrd,bgrs->bsgrd,bkgd,bkgd"
    assert sym.evaluate(fwd.flops, vals) == 192 + 192 + 224
    assert sym.evaluate(bwd.flops, vals) == 5 * 192 + 4 * 32
