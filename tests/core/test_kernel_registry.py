"""The kernel registry: a model plugin's own kernels, scoped to its models; the standard ones
(conv2d, relu, batchnorm, pooling, scalar reductions) on a small CNN, with FLOPs, parameters,
saved activations and data-parallel sharding checked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from stage_core.api import (GraphBuilder, KernelDef, KernelSpec, ModelConfig, ModelSpec, Plan, differentiate, hookimpl,
                            main, param_counts, plan_job, step_values, total)
from stage_core.kernels import STANDARD, conv_out
from stage_core.testing import (assert_flops_conserved, fresh_host, jsonl_plugin, one_device_matmul_flops,
                                ranks_matmul_flops, reference_strategies)


@dataclasses.dataclass(frozen=True)
class CNNConfig(ModelConfig):
    name: str = "cnn"
    family: str = "cnn"
    image: int = 32
    channels: int = 16
    classes: int = 10
    dtype: str = "bf16"
    seq_len: int = 1  # the batch is images; there is no sequence


def cross_entropy_backward(g):  # a classifier's loss: softmax minus one-hot per logit, 2 FLOPs
    return [KernelDef(spec="b,bk,b->bk", reads=("dy", "y1", "x1"), grads=(0,), flops=[(2, "bk", "other")])]


def cross_entropy_forward(call):
    return KernelDef(spec="bk,b->b,bk", flops=[(4, "bk", "other")], whole=["k"], out_dtypes=["fp32", "bf16"])


CLASSES_LOSS = KernelSpec("cross_entropy_classes", cross_entropy_forward, cross_entropy_backward)


class CNN:
    @hookimpl
    def stage_models(self):
        kernels = tuple(STANDARD[k] for k in ("conv2d", "batchnorm", "relu", "maxpool", "avgpool", "mean"))
        return [ModelSpec("cnn", "cnn", build_cnn_with_loss, {"cnn": CNNConfig()}, CNNConfig.from_dict,
                          kernels=kernels + (CLASSES_LOSS,))]


def build_cnn_with_loss(c: CNNConfig):
    """build_cnn with its loss a registered kernel (the classifier's cross-entropy)."""
    g = GraphBuilder(c.name, dims={"C": c.channels, "K": c.classes}, dtype=c.dtype, meta={"layers": 2, "seq_len": 1})
    x = g.input("images", ("b", 3, c.image, c.image), dtype=c.dtype)
    labels = g.input("labels", ("b",))
    with g.layer(0):
        y = g.kernel("conv2d", x, g.param("conv1.weight", ("C", 3, 3, 3)), name="conv1", padding=1)
        y = g.kernel("batchnorm", y, g.param("bn1.weight", ("C",)), g.param("bn1.bias", ("C",)), name="bn1")
        y = g.kernel("relu", y, name="relu1")
        y, _indices = g.kernel("maxpool", y, name="pool1", size=2)
    with g.layer(1):
        y = g.kernel("conv2d", y, g.param("conv2.weight", ("C", "C", 3, 3)), name="conv2", padding=1)
        y = g.kernel("relu", y, name="relu2")
        y = g.kernel("avgpool", y, name="gap", size="global")
    logits = g.einsum("bc,kc->bk", y, g.param("fc.weight", ("K", "C")), name="fc")
    loss, _probs = g.kernel("cross_entropy_classes", logits, labels, name="loss")
    return g.finish(g.kernel("mean", loss, name="mean_loss", spec="b->"))


HOST = fresh_host((CNN(), "cnn"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"))


def forward_graph():
    from stage_core.api import resolve_model
    from stage_core.flow import model_graphs

    spec, config = resolve_model(HOST, "cnn")
    return model_graphs(spec, config, Plan())[0]


def test_conv_output_size_is_pytorchs():
    # torch.nn.Conv2d: floor((H + 2p - d(k - 1) - 1) / s) + 1
    assert conv_out(224, 7, 2, 3, 1) == 112 and conv_out(56, 3, 2, 1, 1) == 28 and conv_out(32, 3, 1, 1, 2) == 30


def test_parameters_and_forward_flops_by_hand():
    C, K = 16, 10
    graph = forward_graph()
    assert param_counts(graph)[0] == C * 3 * 9 + 2 * C + C * C * 9 + K * C
    values = step_values(graph, b=4, s=1)
    # conv1: 2 FLOPs per multiply-add, b·C·32·32 outputs x 3·9 taps; conv2: b·C·16·16 x C·9; fc 2·b·K·C
    matmul = 2 * 4 * C * 32 * 32 * 27 + 2 * 4 * C * 16 * 16 * C * 9 + 2 * 4 * K * C
    assert total(graph, "matmul_flops", values) == matmul
    # batchnorm 7 a value, relu 1 a value (both before the pool and after conv2), max pool one compare a tap
    # (4 taps an output), the global average pool an add a value and a divide an output, the loss 4 a logit,
    # the mean an add an image and a divide
    other = (7 * 4 * C * 32 * 32 + 4 * C * 32 * 32 + 4 * C * 16 * 16 * 4 + 4 * C * 16 * 16 + 4 * C * 16 * 16 + 4 * C
             + 4 * 4 * K + 4 + 1)
    assert total(graph, "other_flops", values) == other


def test_backward_reads_what_it_saves_and_doubles_the_convolutions():
    graph = forward_graph()
    tg = differentiate(graph)
    values = step_values(graph, b=4, s=1)
    fwd = total(tg, "matmul_flops", values, tg.forward_ops)
    # conv1's input (the images) needs no gradient: its dgrad is not run; every other matmul's backward is 2x
    conv1 = 2 * 4 * 16 * 32 * 32 * 27
    assert total(tg, "matmul_flops", values, tg.backward_ops) == 2 * fwd - conv1
    saved = {t.name.rsplit(".", 1)[-1] for op in tg.forward_ops for t in op.saved}
    # conv1's weight gradient reads the images, conv2's the pooled map; the max pool keeps its arg-max indices
    assert {"images", "conv1", "pool1:0", "pool1:1"} <= saved
    assert "relu1" in saved and "bn1" not in saved  # batchnorm's backward reads its input (conv1), not its output


def test_data_parallel_conserves_flops_and_batchnorm_keeps_local_statistics():
    assert assert_flops_conserved(HOST, "cnn", plans=[Plan(dp=2), Plan(dp=4, micro_batches=2)]) == 2
    result = plan_job(HOST, "cnn", {}, Plan(dp=2))
    assert ranks_matmul_flops(result) == one_device_matmul_flops(result)
    names = [n.name for p in result.job.programs for n in p.nodes if n.type == 7]
    assert names == ["grad_sync.bucket0:all_reduce.dp"]  # no collective in batchnorm: per-rank statistics


def test_the_kernels_belong_to_their_model_only():
    other = GraphBuilder("other", dims={"h": 8})
    x = other.input("x", ("b", "h"), dtype="bf16")
    with pytest.raises(ValueError, match="kernel 'relu' is not registered for model other"):
        other.kernel("relu", x, name="act")


def test_a_scalar_loss_trains_end_to_end(tmp_path, capsys):
    assert main(["generate", "--model", "cnn", "--dp", "2", "--format", "jsonl", "-o", str(tmp_path / "set")],
                host=HOST) == 0
    assert "wrote 2 traces" in capsys.readouterr().out


def test_a_kernel_returning_nonsense_is_the_plugins_fault(capsys):
    bad = KernelSpec("relu", lambda call: {"spec": "ab->ab"})

    class Bad:
        @hookimpl
        def stage_models(self):
            return [ModelSpec("cnn", "cnn", build_cnn_with_loss, {"cnn": CNNConfig()}, CNNConfig.from_dict,
                              kernels=(bad,) + tuple(STANDARD[k] for k in ("conv2d", "batchnorm", "maxpool",
                                                                            "avgpool", "mean")) + (CLASSES_LOSS,))]

    assert main(["report", "--model", "cnn"], host=fresh_host((Bad(), "bad"))) == 1
    assert capsys.readouterr().err.strip() == ("stage: error: plugin 'bad': model family 'cnn': build failed: "
                                               "KernelError: kernel relu: returned a dict, not a KernelDef")


def test_the_guides_kernel_example_works():
    """docs/plugins.md's kernel example, as written there, in a model."""
    def forward(call):
        (x,) = call.inputs
        return KernelDef(spec="bsh->bsh", flops=[(2, "bsh", "other")])

    def backward(g):
        return [KernelDef(spec="bsh,bsh->bsh", reads=("dy", "x0"), grads=(0,), flops=[(3, "bsh", "other")])]

    squared_tanh = KernelSpec("squared_tanh", forward, backward, kind="elementwise")
    g = GraphBuilder("guide", dims={"h": 8}, kernels=[squared_tanh])
    x = g.input("x", ("b", "s", "h"), dtype="bf16")
    w = g.param("w", ("h", "h"))
    y = g.kernel("squared_tanh", g.einsum("bsh,hk->bsk", x, w, name="proj"), name="act")
    graph = g.finish(g.kernel("squared_tanh", y, name="act2"))
    tg = differentiate(graph)
    values = {"b": 2, "s": 3, "h": 8}
    assert total(tg, "other_flops", values, tg.forward_ops) == 2 * 2 * (2 * 3 * 8)
    assert total(tg, "other_flops", values, tg.backward_ops) == 2 * 3 * (2 * 3 * 8)
