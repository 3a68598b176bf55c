"""The GPT forward graph: one device, forward only, over the plan's dims ``b`` and ``s``.

Layout (the conventions STAGE's parallel strategies read):

* embedding: a lookup of ``wte`` [V, h] plus learned positions ``wpe`` [P, h], then
  dropout; the dropout output is the first residual-stream tensor.
* each layer (``layers.<i>.``), pre-LayerNorm:
  ``attn.norm`` -> ``attn.qkv`` (fused weight [h, g, a/g+2, d] with bias) ->
  ``attn.split`` into q [b,s,g,a/g,d], k and v [b,s,g,d] -> attention core
  (block ``attn_core``: scores, softmax, dropout, context; or one flash kernel) ->
  ``attn.proj`` (weight [g, a/g, d, h]) -> ``attn.residual`` (bias-dropout-add, where the
  projection's bias is added) -> ``mlp.norm`` -> ``mlp.fc1`` [h, f] ->
  ``mlp.bias_gelu`` -> ``mlp.fc2`` [f, h] -> ``mlp.residual`` (bias-dropout-add).
* ``final_norm`` -> ``head`` (``bsh,vh->bsv`` with ``wte`` when tied) -> ``loss``.
"""

from __future__ import annotations

from fractions import Fraction

from stage_core import sym
from stage_core.ir.builder import GraphBuilder
from stage_core.ir.graph import Graph

from .config import GPTConfig

RESIDUAL = ("residual",)


def build(config: GPTConfig) -> Graph:
    """The single-device forward graph of ``config`` (dims in ``graph.dims``; b, s unbound)."""
    c = config
    g = GraphBuilder(
        c.name or "gpt",
        dims=c.dims(),
        dtype=c.dtype,
        meta={
            "family": c.family,
            "layers": c.layers,
            "seq_len": c.seq_len,
            "max_positions": c.max_positions,
            "attention": c.attention,
        },
    )
    # Shapes built once and reused by every layer (sympy expressions, not strings).
    h, a, kv, d, f, V, P = sym.dims("h a g d f V P")
    r = a / kv  # query heads per group (1 for multi-head attention)
    c_qkv = r + 2  # q heads, one k and one v per group
    shape = {
        "h": (h,),
        "f": (f,),
        "w_qkv": (h, kv, c_qkv, d),
        "b_qkv": (kv, c_qkv, d),
        "q": ("b", "s", kv, r, d),
        "kv": ("b", "s", kv, d),
        "w_proj": (kv, r, d, h),
        "w_fc1": (h, f),
        "w_fc2": (f, h),
    }

    tokens = g.input("tokens", ("b", "s"))
    labels = g.input("labels", ("b", "s"))
    wte = g.param("embed.wte", (V, h))
    wpe = g.param("embed.wpe", (P, h))
    x = g.embedding(tokens, wte, wpe, name="embed")  # adds the first s rows of wpe
    x = g.dropout(x, name="embed.dropout", tags=RESIDUAL)

    for i in range(c.layers):
        with g.layer(i):
            y = g.norm("layernorm", x, g.param("attn.norm.weight", shape["h"]),
                       g.param("attn.norm.bias", shape["h"]), name="attn.norm")
            qkv = g.einsum("bsh,hgcd->bsgcd", y, g.param("attn.qkv.weight", shape["w_qkv"]),
                           bias=g.param("attn.qkv.bias", shape["b_qkv"]), name="attn.qkv")
            q, k, v = g.split(qkv, "bsgcd->bsgrd,bsgd,bsgd", (shape["q"], shape["kv"], shape["kv"]),
                              name="attn.split")
            ctx = attention_core(g, q, k, v, kind=c.attention, causal_flops=c.causal_flops, dropout=True)
            out = g.einsum("bsgrd,grdh->bsh", ctx, g.param("attn.proj.weight", shape["w_proj"]),
                           name="attn.proj")
            x = g.dropout_add(out, x, g.param("attn.proj.bias", shape["h"]), name="attn.residual",
                              tags=RESIDUAL)

            y = g.norm("layernorm", x, g.param("mlp.norm.weight", shape["h"]),
                       g.param("mlp.norm.bias", shape["h"]), name="mlp.norm")
            u = g.einsum("bsh,hf->bsf", y, g.param("mlp.fc1.weight", shape["w_fc1"]), name="mlp.fc1")
            u = g.bias_gelu(u, g.param("mlp.fc1.bias", shape["f"]), name="mlp.bias_gelu")
            z = g.einsum("bsf,fh->bsh", u, g.param("mlp.fc2.weight", shape["w_fc2"]), name="mlp.fc2")
            x = g.dropout_add(z, x, g.param("mlp.fc2.bias", shape["h"]), name="mlp.residual",
                              tags=RESIDUAL)

    y = g.norm("layernorm", x, g.param("final_norm.weight", shape["h"]),
               g.param("final_norm.bias", shape["h"]), name="final_norm")
    head = wte if c.tie_embeddings else g.param("head.weight", (V, h))
    logits = g.einsum("bsh,vh->bsv", y, head, name="head")
    return g.finish(g.cross_entropy(logits, labels, name="loss"))


def attention_core(g: GraphBuilder, q, k, v, *, kind: str, causal_flops: bool, dropout: bool):
    """softmax(q·kᵀ)·v in block ``attn_core``: q [b,s,g,r,d], k and v [b,s,g,d] -> [b,s,g,r,d].

    ``classic`` keeps the s×s probabilities (and the attention-dropout mask) for
    backward; ``flash`` keeps only q, k, v, the output and the log-sum-exp (its dropout,
    when any, regenerates the mask from the RNG state and stores nothing).
    """
    with g.block("attn_core"):
        if kind == "flash":
            return g.flash_attention(q, k, v, causal_flops=causal_flops, name="attn.flash")
        scale = Fraction(1, 2) if causal_flops else 1
        scores = g.einsum("bsgrd,bkgd->bgrsk", q, k, name="attn.scores", flops_scale=scale)
        probs = g.softmax(scores, over=-1, name="attn.softmax")
        if dropout:
            probs = g.dropout(probs, name="attn.dropout")
        return g.einsum("bgrsk,bkgd->bsgrd", probs, v, name="attn.context", flops_scale=scale)
