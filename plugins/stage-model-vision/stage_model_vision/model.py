"""The forward graphs of the image families: one device, forward only, over the plan's ``b``
(images per micro-batch); convolutions, BatchNorm, ReLU and pooling are the core's
registered kernels (``stage_core.kernels.STANDARD``).

Layout (what STAGE's strategies read):

* images ``[b, 3, H, W]`` and labels ``[b]``; the classifier's logits ``[b, V]`` (``V`` the
  classes, which tensor parallel shards like a vocabulary) end in a cross-entropy;
* channel dims are named per stage (``m1``, ``n1``, ``c1``...) and the model lists, in
  ``graph.meta["tp_dims"]``, the ones tensor parallel shards (docs/plugins.md, "Conventions"):
  for each convolution one of its two channel dims, so a column-parallel convolution (its
  output channels split) is followed by BatchNorm and ReLU on its channels and a row-
  parallel one (its input channels split) whose partial sums are all-reduced;
* each residual block (ResNet) or layer (VGG, OverFeat) is one ``g.layer`` (pipeline
  stages split on them); the stem and the classifier are outside the layers (first and
  last stage).

Activation memory is what PyTorch keeps: a convolution its input, BatchNorm its input,
ReLU its output (torchvision's in-place ReLU over the BatchNorm output), max pooling its
input and its int64 arg-max indices, dropout its 1-byte mask, the classifier its input.
"""

from __future__ import annotations

from stage_core.api import RESIDUAL, Graph, GraphBuilder, blocks, sym

from .config import RESNET_DEPTHS, VGG_VARIANTS, OverFeatConfig, ResNetConfig, VGGConfig, ViTConfig


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def alternate(chain: list[str]) -> tuple[str, ...]:
    """Every other dim of a chain of channel dims (each layer reads one and writes the next):
    the layers alternate column parallel (writing a listed dim) and row parallel (reading one)."""
    return tuple(chain[1::2])


def _builder(c, dims: dict, tp_dims: tuple[str, ...], **meta) -> GraphBuilder:
    return GraphBuilder(c.name or c.family, dims=dims, dtype=c.dtype,
                        meta={"family": c.family, "layers": c.layers, "seq_len": None, "tp_dims": tp_dims,
                              "image_size": c.image_size, **meta})


def _inputs(g: GraphBuilder, size: int):
    images = g.input("images", ("b", 3, size, size), dtype=g.dtype)
    labels = g.input("labels", ("b",))
    return images, labels


def _conv(g: GraphBuilder, x, out: str, k: int, *, name: str, stride: int = 1, padding: int = 0, bias: bool = False):
    w = g.param(f"{name}.weight", (out, x.shape[1], k, k))
    extra = (g.param(f"{name}.bias", (out,)),) if bias else ()
    return g.kernel("conv2d", x, w, *extra, name=name, stride=stride, padding=padding)


def _bn(g: GraphBuilder, x, *, name: str, sync: bool):
    c = x.shape[1]
    return g.kernel("batchnorm", x, g.param(f"{name}.weight", (c,)), g.param(f"{name}.bias", (c,)), name=name,
                    sync=sync)


def _classifier(g: GraphBuilder, x, labels, *, name: str = "fc") -> Graph:
    """``x`` [b, c] -> logits [b, V] (weight [V, c], bias [V]) -> cross-entropy."""
    w = g.param(f"{name}.weight", ("V", x.shape[1]))
    logits = g.einsum("bc,vc->bv", x, w, bias=g.param(f"{name}.bias", ("V",)), name=name)
    return g.finish(g.cross_entropy(logits, labels, name="loss"))


# --------------------------------------------------------------------------- ResNet


def stem_dim(c: ResNetConfig) -> str:
    """The stem's channels: ``w0``, or ``c1`` where the first stage keeps them (basic blocks)."""
    return "c1" if RESNET_DEPTHS[c.depth][0] == "basic" else "w0"


def resnet_dims(c: ResNetConfig) -> dict[str, int]:
    """Stem width ``w0``; per stage i (1..4) the inner widths ``m{i}``, ``n{i}`` and the
    block output ``c{i}`` (bottleneck: 4 x the inner width)."""
    kind, _ = RESNET_DEPTHS[c.depth]
    dims = {stem_dim(c): c.width, "V": c.classes}
    for i in range(1, 5):
        inner = c.width * 2 ** (i - 1)
        dims[f"m{i}"] = inner
        dims[f"n{i}"] = inner
        dims[f"c{i}"] = inner * (4 if kind == "bottleneck" else 1)
    return dims


def resnet_tp_dims(c: ResNetConfig) -> tuple[str, ...]:
    """Bottleneck: conv1 (column, m), conv2 (column, n: its input gathered), conv3 (row, n);
    basic: conv1 (column, m), conv2 (row, m).  The stem and the downsampling convolutions
    run whole on every tp rank."""
    kind, _ = RESNET_DEPTHS[c.depth]
    return tuple(d for i in range(1, 5) for d in ((f"n{i}", f"m{i}") if kind == "bottleneck" else (f"m{i}",))) + (
        "V",)


def build_resnet(c: ResNetConfig) -> Graph:
    kind, counts = RESNET_DEPTHS[c.depth]
    g = _builder(c, resnet_dims(c), resnet_tp_dims(c))
    sync = c.sync_batchnorm
    x, labels = _inputs(g, c.image_size)
    size = c.image_size
    with g.scope("stem"):
        x = _conv(g, x, stem_dim(c), 7, name="conv", stride=2, padding=3)
        x = g.kernel("relu", _bn(g, x, name="bn", sync=sync), name="relu")
        x, _indices = g.kernel("maxpool", x, name="maxpool", size=3, stride=2, padding=1)
    size = conv_out(conv_out(size, 7, 2, 3), 3, 2, 1)
    layer = 0
    for stage, blocks_ in enumerate(counts, start=1):
        for j in range(blocks_):
            stride = 2 if stage > 1 and j == 0 else 1
            with g.layer(layer, f"layer{stage}.{j}"):
                x = _block(g, x, kind, stage, stride, sync)
            layer += 1
    x = g.kernel("avgpool", x, name="avgpool", size="global")
    return _classifier(g, x, labels)


def _block(g: GraphBuilder, x, kind: str, stage: int, stride: int, sync: bool):
    """A residual block (torchvision's v1.5: the stride on the 3x3 convolution)."""
    m, n, out = f"m{stage}", f"n{stage}", f"c{stage}"
    identity = x
    if kind == "bottleneck":
        y = g.kernel("relu", _bn(g, _conv(g, x, m, 1, name="conv1"), name="bn1", sync=sync), name="relu1")
        y = g.kernel("relu", _bn(g, _conv(g, y, n, 3, name="conv2", stride=stride, padding=1), name="bn2",
                                 sync=sync), name="relu2")
        y = _bn(g, _conv(g, y, out, 1, name="conv3"), name="bn3", sync=sync)
    else:
        y = g.kernel("relu", _bn(g, _conv(g, x, m, 3, name="conv1", stride=stride, padding=1), name="bn1",
                                 sync=sync), name="relu1")
        y = _bn(g, _conv(g, y, out, 3, name="conv2", padding=1), name="bn2", sync=sync)
    if stride != 1 or getattr(x.shape[1], "name", None) != out:
        identity = _bn(g, _conv(g, x, out, 1, name="downsample.conv", stride=stride), name="downsample.bn",
                       sync=sync)
    return g.kernel("relu", g.add(y, identity, name="residual"), name="relu", tags=RESIDUAL)


# --------------------------------------------------------------------------- VGG and OverFeat


def _fc_head(g: GraphBuilder, x, labels, widths: tuple[str, str]) -> Graph:
    """The classifier of VGG and OverFeat: fc6 over the whole feature map (weight [f, c, h, w],
    as torchvision's Linear over the flattened map), ReLU, dropout, fc7, ReLU, dropout, fc8."""
    first, second = widths
    n = len(blocks_of(g))
    with g.layer(n, "fc6"):
        w = g.param("weight", (first, *x.shape[1:]))
        x = g.einsum("bchw,fchw->bf", x, w, bias=g.param("bias", (first,)), name="linear")
        x = g.dropout(g.kernel("relu", x, name="relu"), name="dropout")
    with g.layer(n + 1, "fc7"):
        x = g.einsum("bf,ef->be", x, g.param("weight", (second, first)), bias=g.param("bias", (second,)),
                     name="linear")
        x = g.dropout(g.kernel("relu", x, name="relu"), name="dropout")
    with g.layer(n + 2, "fc8"):
        w = g.param("weight", ("V", second))
        logits = g.einsum("be,ve->bv", x, w, bias=g.param("bias", ("V",)), name="linear")
    return g.finish(g.cross_entropy(logits, labels, name="loss"))


def blocks_of(g: GraphBuilder) -> set:
    return {op.layer for op in g.graph.ops if op.layer is not None}


def vgg_dims(c: VGGConfig) -> dict[str, int]:
    convs = [v for v in VGG_VARIANTS[c.variant] if v != "M"]
    dims = {f"k{i}": v for i, v in enumerate(convs, start=1)}
    dims.update(f=c.fc_width, e=c.fc_width, V=c.classes)
    return dims


def build_vgg(c: VGGConfig) -> Graph:
    """Each convolution (with its ReLU and the pooling after it) is a layer.  torchvision's
    AdaptiveAvgPool2d((7, 7)) is the identity at 224 pixels; at other sizes fc6 reads the
    whole final map (its weight grows or shrinks with it)."""
    dims = vgg_dims(c)
    convs = [k for k in dims if k.startswith("k")]
    g = _builder(c, dims, alternate(["rgb", *convs, "f", "e", "V"]))
    x, labels = _inputs(g, c.image_size)
    variant = VGG_VARIANTS[c.variant]
    layer = 0
    for i, v in enumerate(variant):
        if v == "M":
            continue
        layer += 1
        with g.layer(layer - 1, f"conv{layer}"):
            x = g.kernel("relu", _conv(g, x, f"k{layer}", 3, name="conv", padding=1, bias=True), name="relu")
            if i + 1 < len(variant) and variant[i + 1] == "M":
                x, _indices = g.kernel("maxpool", x, name="pool", size=2, stride=2)
    return _fc_head(g, x, labels, ("f", "e"))


#: OverFeat fast (Sermanet et al. 2014, Table 1): (output channels, kernel, stride, pool after)
OVERFEAT_FAST = ((96, 11, 4, 2), (256, 5, 1, 2), (512, 3, 1, 0), (1024, 3, 1, 0), (1024, 3, 1, 2))
OVERFEAT_FC = (3072, 4096)


def overfeat_dims(c: OverFeatConfig) -> dict[str, int]:
    dims = {f"k{i}": out for i, (out, *_rest) in enumerate(OVERFEAT_FAST, start=1)}
    dims.update(f=OVERFEAT_FC[0], e=OVERFEAT_FC[1], V=c.classes)
    return dims


def build_overfeat(c: OverFeatConfig) -> Graph:
    dims = overfeat_dims(c)
    g = _builder(c, dims, alternate(["rgb", *(f"k{i}" for i in range(1, 6)), "f", "e", "V"]))
    x, labels = _inputs(g, c.image_size)
    for i, (_out, k, stride, pool) in enumerate(OVERFEAT_FAST, start=1):
        with g.layer(i - 1, f"conv{i}"):
            x = g.kernel("relu", _conv(g, x, f"k{i}", k, name="conv", stride=stride, padding=1 if k == 3 else 0,
                                       bias=True), name="relu")
            if pool:
                x, _indices = g.kernel("maxpool", x, name="pool", size=pool, stride=pool)
    return _fc_head(g, x, labels, ("f", "e"))


# --------------------------------------------------------------------------- ViT


def build_vit(c: ViTConfig) -> Graph:
    """torchvision's VisionTransformer: conv_proj (patch x patch, stride patch) -> the class
    token joined in front -> + learned positions -> encoder layers (pre-LayerNorm, multi-head
    attention with the fused QKV of the blocks' layout, GeLU MLP) -> final LayerNorm -> the
    class token -> head."""
    g = blocks.model_builder(c, tp_dims=(), image_size=c.image_size, attention=c.attention)
    g.graph.meta["seq_len"] = c.seq_len
    h = sym.dim("h")
    images, labels = _inputs(g, c.image_size)
    side = c.image_size // c.patch
    patches = sym.dim("s") - 1
    with g.scope("embed"):
        w = g.param("conv_proj.weight", (h, 3, c.patch, c.patch))
        x = g.kernel("conv2d", images, w, g.param("conv_proj.bias", (h,)), name="conv_proj", stride=c.patch)
        x = g.view(x, "bhpq->bnh", ("b", patches, h), name="flatten")
        cls = g.param("class_token", (1, h))
        x = g.concat([cls, x], "ch,bnh->bsh", ("b", "s", h), name="cat")
        x = g.elementwise("add", x, g.param("pos_embedding", ("s", h)), spec="bsh,sh->bsh", name="positions",
                          tags=RESIDUAL)
    for i in range(c.layers):
        with g.layer(i):
            y = blocks.norm(g, x, "ln_1", "layernorm", bias=True)
            out = blocks.gqa_attention(g, y, kind=c.attention, qkv_bias=True, cache=False)  # bidirectional
            x = g.dropout_add(out, x, g.param("attn.proj.bias", (h,)), name="attn.residual", tags=RESIDUAL)
            y = blocks.norm(g, x, "ln_2", "layernorm", bias=True)
            z = blocks.gelu_mlp(g, y)
            x = g.dropout_add(z, x, g.param("mlp.fc2.bias", (h,)), name="mlp.residual", tags=RESIDUAL)
    x = blocks.norm(g, x, "ln", "layernorm", bias=True)
    first = g.kernel("first_token", x, name="class_token")
    w = g.param("head.weight", ("V", h))
    logits = g.einsum("bh,vh->bv", first, w, bias=g.param("head.bias", ("V",)), name="head")
    return g.finish(g.cross_entropy(logits, labels, name="loss"))

