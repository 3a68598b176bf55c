"""The standard transformer blocks, written once on :class:`GraphBuilder`.

Model plugins compose these; each block appends the same ops, with the same names,
shapes, FLOPs and bytes, that a plugin would write by hand.  They follow the layout
conventions STAGE's parallel strategies read (``docs/design.md``):

* dims: ``h`` hidden, ``a`` query heads, ``g`` query groups (key/value heads), ``d``
  head dim, ``f`` FFN width (an MLP may take another, e.g. ``fs``), ``V`` padded
  vocabulary, ``P`` learned position rows; ``b`` and ``s`` are the plan's.
* attention (GQA; multi-head attention is g = a): the fused QKV weight is
  [h, g, a/g+2, d] (``bsh,hgcd->bsgcd``): per group its a/g query heads, one key and
  one value head; ``split`` gives q [b,s,g,a/g,d], k and v [b,s,g,d]; the core
  (block ``attn_core``, what selective recompute redoes) gives [b,s,g,a/g,d]; the
  output projection is [g, a/g, d, h] (``bsgrd,grdh->bsh``).
* residual-stream tensors are tagged :data:`RESIDUAL` (the caller adds residuals:
  a plain add or a bias-dropout-add).

Every block takes a ``prefix`` (its name scope inside the layer, e.g. ``attn``), so op
``qkv`` of layer 3 is ``layers.3.attn.qkv`` and its weight ``layers.3.attn.qkv.weight``.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from .. import sym
from .builder import GraphBuilder
from .graph import Graph
from .tensor import Tensor

#: tag of the residual-stream tensors (what sequence parallel and the memory model look for)
RESIDUAL = ("residual",)
#: attention core kernels: one fused FlashAttention kernel, or scores, softmax, context
ATTENTION_KINDS = ("flash", "classic")


# ---------------------------------------------------------------------- graph prologue and epilogue
def model_builder(config, *, kernels=None, **meta) -> GraphBuilder:
    """A builder for ``config`` (a :class:`~stage_core.models.ModelConfig` with ``dims()``,
    ``dtype``, ``layers`` and ``seq_len``): named ``config.name`` (or its family), over its
    dims; ``graph.meta`` holds family, layers and seq_len, then ``meta``.  ``kernels``: the
    registered kernels the model calls (its ``ModelSpec.kernels``; default: those of the
    model the host is building), so that ``build(config)`` called directly works too."""
    return GraphBuilder(
        config.name or config.family,
        dims=config.dims(),
        dtype=config.dtype,
        meta={"family": config.family, "layers": config.layers, "seq_len": config.seq_len, **meta},
        kernels=kernels,
    )


def embed(g: GraphBuilder, *, positions: bool = False, tags=RESIDUAL) -> tuple[Tensor, Tensor, Tensor]:
    """Inputs ``tokens`` and ``labels`` [b, s], the table ``embed.wte`` [V, h] and the lookup ``embed``.

    ``positions``: learned positions ``embed.wpe`` [P, h] too, the first s rows added in
    the lookup kernel (GPT).  ``tags`` tag the output (the first residual-stream tensor,
    unless the caller applies dropout first).  Returns (embeddings, labels, wte).
    """
    h, V, P = sym.dims("h V P")
    tokens = g.input("tokens", ("b", "s"))
    labels = g.input("labels", ("b", "s"))
    wte = g.param("embed.wte", (V, h))
    wpe = g.param("embed.wpe", (P, h)) if positions else None
    return g.embedding(tokens, wte, wpe, name="embed", tags=tags), labels, wte


def norm(g: GraphBuilder, x: Tensor, name: str, kind: str = "rmsnorm", *, bias: bool = False, over: int = 1,
         partial_sums: bool = False, tags=()) -> Tensor:
    """``kind`` (``rmsnorm``, ``layernorm``) over the last ``over`` dims of ``x``: op ``name``,
    weight ``<name>.weight`` (and ``<name>.bias`` with ``bias``) of those dims' shape;
    ``partial_sums`` as :meth:`GraphBuilder.norm`; ``tags`` tag the output."""
    width = tuple(x.shape[x.rank - over:])
    weight = g.param(f"{name}.weight", width)
    return g.norm(kind, x, weight, g.param(f"{name}.bias", width) if bias else None, name=name, over=over,
                  partial_sums=partial_sums, tags=tags)


def lm_head(g: GraphBuilder, x: Tensor, labels: Tensor, wte: Tensor, *, norm_kind: str = "rmsnorm",
            norm_bias: bool = False, tied: bool = False, softcap=None, bias: bool = False) -> Graph:
    """``final_norm`` -> ``head`` (``bsh,vh->bsv``: ``wte`` when ``tied``, else ``head.weight``
    [V, h]; with ``bias`` a ``head.bias`` [V], Phi-3.5-MoE's) -> with ``softcap`` a ``softcap``
    kernel on the logits (Gemma 2) -> ``loss`` (cross-entropy against ``labels``); returns the
    finished graph."""
    y = norm(g, x, "final_norm", norm_kind, bias=norm_bias)
    head = wte if tied else g.param("head.weight", sym.dims("V h"))
    head_bias = g.param("head.bias", (sym.dim("V"),)) if bias else None
    logits = g.einsum("bsh,vh->bsv", y, head, bias=head_bias, name="head")
    if softcap is not None:
        logits = g.softcap(logits, softcap, name="softcap")
    return g.finish(g.cross_entropy(logits, labels, name="loss"))


# ---------------------------------------------------------------------- attention
@lru_cache(maxsize=None)
def _gqa_shapes() -> dict:
    h, a, kv, d = sym.dims("h a g d")
    r = a / kv  # query heads per group (1 for multi-head attention)
    return {
        "w_qkv": (h, kv, r + 2, d),  # the group's query heads, one key head and one value head
        "b_qkv": (kv, r + 2, d),
        "q": ("b", "s", kv, r, d),
        "kv": ("b", "s", kv, d),
        "d": (d,),
        "w_proj": (kv, r, d, h),
    }


def attention_core(g: GraphBuilder, q: Tensor, k: Tensor, v: Tensor, *, kind: str = "flash",
                   causal_flops: bool = False, dropout: bool = False, prefix: str = "attn",
                   window: int | None = None, softcap=None, value_in_key: bool = False,
                   causal: bool = True) -> Tensor:
    """softmax(q·kᵀ)·v in block ``attn_core``: q [b,s,g,r,d], k [b,s,g,d], v [b,s,g,dv] -> [b,s,g,r,dv].

    ``flash``: one kernel (``flash``) that keeps q, k, v, the output and the log-sum-exp.
    ``classic``: ``scores`` (``bsgrd,bkgd->bgrsk``), ``softmax``, with ``dropout`` an
    attention ``dropout`` (its 1-byte mask kept), and ``context``; the s×s
    probabilities are kept for backward.  ``causal_flops`` halves the FLOPs of Q·Kᵀ
    and P·V (in the flash kernel its softmax's too).  When v's head dim differs from q's and k's (MLA) the context
    einsum gives it a letter of its own (``v``), as the flash kernel does.  Flash
    attention's dropout regenerates its mask and costs nothing here.

    ``window``: sliding-window (local) attention over the last ``window`` keys; the
    flash kernel counts only those (``GraphBuilder.flash_attention``), while classic
    attention computes the full s×s scores and masks them, as eager attention does.
    ``softcap``: ``softcap·tanh(scores/softcap)`` before the softmax (Gemma 2), inside
    the flash kernel or as a ``softcap`` kernel on the classic scores.  ``value_in_key``:
    v is the leading part of k (MLA absorbed), read once by the flash kernel.
    ``causal``: a decoder's mask (the flash kernel skips the masked half; classic
    attention computes every score and masks them).
    """
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; known: {', '.join(ATTENTION_KINDS)}")
    with g.scope(prefix), g.block("attn_core"):
        if kind == "flash":
            return g.flash_attention(q, k, v, causal_flops=causal_flops, causal=causal, name="flash",
                                     window=window, softcap=softcap, value_in_key=value_in_key)
        scale = Fraction(1, 2) if causal_flops else 1
        scores = g.einsum("bsgrd,bkgd->bgrsk", q, k, name="scores", flops_scale=scale)
        if softcap is not None:
            scores = g.softcap(scores, softcap, name="softcap")
        probs = g.softmax(scores, over=-1, name="softmax")
        if dropout:
            probs = g.dropout(probs, name="dropout")
        vd = "d" if v.shape[-1] == k.shape[-1] or sym.equal(v.shape[-1], k.shape[-1]) else "v"
        return g.einsum(f"bgrsk,bkg{vd}->bsgr{vd}", probs, v, name="context", flops_scale=scale)


#: where a q/k norm normalizes: each head over d, or all heads together (OLMo 2)
QK_NORM_SPANS = ("head", "all")


def gqa_attention(
    g: GraphBuilder,
    x: Tensor,
    *,
    kind: str = "flash",
    causal_flops: bool = False,
    dropout: bool = False,
    qkv_bias: bool = False,
    qk_norm: str | None = None,
    qk_norm_span: str = "head",
    rope: bool = False,
    rope_names: tuple[str, str] = ("q_rope", "k_rope"),
    window: int | None = None,
    softcap=None,
    sinks: bool = False,
    prefix: str = "attn",
    cache: bool = True,
) -> Tensor:
    """Grouped-query (or multi-head) attention of the normed ``x`` [b,s,h] -> [b,s,h].

    Ops under ``prefix``: ``qkv`` (weight [h, g, a/g+2, d]; bias [g, a/g+2, d] with
    ``qkv_bias``) -> ``split`` -> with ``qk_norm`` (a norm kind, e.g. ``rmsnorm``) a
    ``q_norm`` and ``k_norm``: per head over d (weights [d]; ``qk_norm_span="head"``)
    or over all of q and all of k (weights [g, a/g, d] and [g, d]; ``"all"``, OLMo 2;
    under tensor parallel the kernels all-reduce their row statistics) -> with
    ``rope`` RoPE on q and on k (ops named ``rope_names``) -> k and v declared as the
    KV cache (``k_cache``, ``v_cache``) -> :func:`attention_core`
    (``kind``, ``causal_flops``, ``dropout``, ``window``, ``softcap``) -> ``proj``
    (weight [g, a/g, d, h], no bias: add one in the residual kernel, as Megatron's
    bias-dropout-add does).  ``cache=False``: k and v are not declared as a cache (an
    encoder's bidirectional attention, which reads every token at once and never decodes).
    ``sinks`` (gpt-oss): a learned logit per head ``sinks`` [g, a/g] joins each query's
    softmax, which scales the head's context by 1/(1 + exp(sink − logsumexp)): one
    ``sink_scale`` kernel on the context.
    """
    if qk_norm_span not in QK_NORM_SPANS:
        raise ValueError(f"unknown qk_norm_span {qk_norm_span!r}; known: {', '.join(QK_NORM_SPANS)}")
    shape = _gqa_shapes()
    with g.scope(prefix):
        weight = g.param("qkv.weight", shape["w_qkv"])
        bias = g.param("qkv.bias", shape["b_qkv"]) if qkv_bias else None
        qkv = g.einsum("bsh,hgcd->bsgcd", x, weight, bias=bias, name="qkv")
        q, k, v = g.split(qkv, "bsgcd->bsgrd,bsgd,bsgd", (shape["q"], shape["kv"], shape["kv"]), name="split")
        if qk_norm:
            whole = qk_norm_span == "all"
            q = norm(g, q, "q_norm", qk_norm, over=3 if whole else 1, partial_sums=whole)
            k = norm(g, k, "k_norm", qk_norm, over=2 if whole else 1, partial_sums=whole)
        if rope:
            q = g.rope(q, name=rope_names[0])
            k = g.rope(k, name=rope_names[1])
        if cache:
            k = g.cache(k, name="k_cache")
            v = g.cache(v, name="v_cache")
    ctx = attention_core(g, q, k, v, kind=kind, causal_flops=causal_flops, dropout=dropout, prefix=prefix,
                         window=window, softcap=softcap, causal=cache)
    if sinks:
        with g.scope(prefix):
            weights = g.param("sinks", shape["w_proj"][:2])
            ctx = g.elementwise("mul", ctx, weights, spec="bsgrd,gr->bsgrd", name="sink_scale")
    return output_projection(g, ctx, prefix=prefix)


def output_projection(g: GraphBuilder, ctx: Tensor, *, prefix: str = "attn") -> Tensor:
    """``<prefix>.proj``: the attention context [b,s,g,a/g,d] -> [b,s,h], weight [g, a/g, d, h], no bias."""
    with g.scope(prefix):
        return g.einsum("bsgrd,grdh->bsh", ctx, g.param("proj.weight", _gqa_shapes()["w_proj"]), name="proj")


# ---------------------------------------------------------------------- MLPs
#: the gated MLPs' activation kernels: silu(gate)·up and gelu(gate)·up
GLU_KINDS = ("swiglu", "geglu")


def swiglu_mlp(g: GraphBuilder, x: Tensor, width=None, *, prefix: str = "mlp", act: str = "swiglu") -> Tensor:
    """Gated MLP [b,s,h] -> [b,s,h]: ``down(act(gate(x), up(x)))``.

    Ops ``gate`` and ``up`` (weights [h, width]), ``act`` (``swiglu`` or ``geglu``,
    Gemma's), ``down`` ([width, h]); no biases.  ``width``: a dim (default ``f``),
    e.g. ``sym.dim("fs")``.
    """
    if act not in GLU_KINDS:
        raise ValueError(f"unknown gated activation {act!r}; known: {', '.join(GLU_KINDS)}")
    h = sym.dim("h")
    width = sym.dim("f") if width is None else width
    with g.scope(prefix):
        gate = g.einsum("bsh,hf->bsf", x, g.param("gate.weight", (h, width)), name="gate")
        up = g.einsum("bsh,hf->bsf", x, g.param("up.weight", (h, width)), name="up")
        out = g.elementwise(act, gate, up, name=act)
        return g.einsum("bsf,fh->bsh", out, g.param("down.weight", (width, h)), name="down")


def gelu_mlp(g: GraphBuilder, x: Tensor, width=None, *, prefix: str = "mlp") -> Tensor:
    """GeLU MLP [b,s,h] -> [b,s,h] as Megatron fuses it: ``fc1`` (weight [h, width]) ->
    ``bias_gelu`` (bias ``fc1.bias`` [width]) -> ``fc2`` (weight [width, h]).

    ``fc2`` has no bias here: the caller adds ``<prefix>.fc2.bias`` in its residual
    kernel (bias-dropout-add).  ``width``: a dim (default ``f``).
    """
    h = sym.dim("h")
    width = sym.dim("f") if width is None else width
    with g.scope(prefix):
        u = g.einsum("bsh,hf->bsf", x, g.param("fc1.weight", (h, width)), name="fc1")
        u = g.bias_gelu(u, g.param("fc1.bias", (width,)), name="bias_gelu")
        return g.einsum("bsf,fh->bsh", u, g.param("fc2.weight", (width, h)), name="fc2")
