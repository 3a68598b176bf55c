"""The core's standard kernels (stage_core.kernels.STANDARD) against hand-computed FLOPs and bytes."""


from stage_core.autodiff import differentiate
from stage_core.ir.builder import GraphBuilder
from stage_core.kernels import STANDARD
from stage_core.models import evaluate_sum


def graph(build, dims=None):
    g = GraphBuilder("k", dims=dims or {}, dtype="bf16", kernels=STANDARD.values())
    labels = g.input("labels", ("b",))
    x = g.input("x", ("b", 3, 8, 8), dtype="bf16")
    y = build(g, x)
    logits = g.einsum("bchw,vchw->bv", y, g.param("fc", (4, *y.shape[1:])), name="fc")
    return differentiate(g.finish(g.cross_entropy(logits, labels)))


def cost(tg, name, what="flops", b=2):
    op = next(op for op in tg.ops if op.name == name)
    return evaluate_sum([getattr(op, what)], {"b": b})


def test_conv2d_forward_and_backward_by_hand():
    tg = graph(lambda g, x: g.kernel("conv2d", x, g.param("w", (4, 3, 3, 3)), name="conv", padding=1))
    macs = 2 * 4 * 8 * 8 * 3 * 3 * 3  # b·o·p·q·c·kh·kw
    assert cost(tg, "conv") == 2 * macs == 27_648
    assert cost(tg, "conv", "bytes") == 2 * (2 * 3 * 64 + 4 * 3 * 9 + 2 * 4 * 64)
    # the image needs no gradient: only the weight gradient, as many multiply-adds as the forward
    assert [op.name for op in tg.backward_ops if op.forward_op and op.forward_op.name == "conv"] == ["conv.bwd.1"]
    assert cost(tg, "conv.bwd.1") == 2 * macs


def test_strided_grouped_conv2d():
    def body(g, x):
        y = g.kernel("relu", g.kernel("conv2d", x, g.param("w0", (3, 3, 1, 1)), name="pointwise"), name="r")
        return g.kernel("conv2d", y, g.param("w", (6, 1, 3, 3)), name="conv", stride=2, padding=1, groups=3)

    tg = graph(body)
    # out 4x4 ((8 + 2 - 3) // 2 + 1), each of 6 channels reads 1 input channel
    assert cost(tg, "conv") == 2 * (2 * 6 * 4 * 4 * 1 * 9)
    assert cost(tg, "conv.bwd.0") == cost(tg, "conv.bwd.1") == cost(tg, "conv")
    assert cost(tg, "r") == 2 * 3 * 64 and cost(tg, "r.bwd.0") == 2 * 3 * 64


def test_maxpool_keeps_int64_indices_and_batchnorm_its_input():
    def body(g, x):
        y = g.kernel("batchnorm", x, g.param("g", (3,)), g.param("b", (3,)), name="bn")
        return g.kernel("maxpool", y, name="pool", size=3, stride=2, padding=1)[0]

    tg = graph(body)
    pool = next(op for op in tg.ops if op.name == "pool")
    assert [str(t.dtype) for t in pool.outputs] == ["bf16", "int64"]
    assert cost(tg, "pool") == 2 * 3 * 4 * 4 * 9  # one comparison per tap, 4x4 outputs
    assert cost(tg, "pool.bwd.0", "bytes") == 2 * 3 * 16 * (2 + 8) + 2 * 3 * 64 * 2
    assert {t.name for t in pool.saved} == {"bn", "pool:1"}
    assert cost(tg, "bn") == 7 * 2 * 3 * 64 and cost(tg, "bn.bwd.0") == 11 * 2 * 3 * 64
    assert {t.name for t in next(op for op in tg.ops if op.name == "bn").saved} == {"x", "g"}


def test_global_average_pool_and_sums():
    tg = graph(lambda g, x: g.view(g.kernel("avgpool", x, name="gap", size="global"), "bc->bcij", ("b", 3, 1, 1)))
    assert cost(tg, "gap") == 2 * 3 * 64 + 2 * 3  # an add per pixel, a divide per output
    g = GraphBuilder("s", kernels=STANDARD.values())
    x = g.input("x", ("b", 5), dtype="bf16")
    y = g.kernel("mean", g.einsum("bk,kn->bn", x, g.param("w", (5, 7)), name="mm"), name="mean", spec="bn->b")
    tg = differentiate(g.finish(y))
    assert cost(tg, "mean") == 2 * 7 + 2 and cost(tg, "mean.bwd.0") == 2 * 7
    g = GraphBuilder("s", kernels=STANDARD.values())
    x = g.input("x", ("b", 5), dtype="bf16")
    loss = g.kernel("sum", g.einsum("bk,kn->bn", x, g.param("w", (5, 7)), name="mm"), name="sum")
    tg = differentiate(g.finish(loss))  # to a scalar: the backward broadcasts the scalar gradient ("->bn")
    assert cost(tg, "sum") == 2 * 7 and cost(tg, "sum.bwd.0") == 0  # an add per element; a copy back
