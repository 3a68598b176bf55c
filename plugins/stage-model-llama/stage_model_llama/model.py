"""The LLaMA forward graph: one device, forward only, over the plan's dims ``b`` and ``s``.

Layout (the conventions STAGE's parallel strategies read):

* embedding: a lookup of ``wte`` [V, h] (no positions table: RoPE); its output is the
  first residual-stream tensor.
* each layer (``layers.<i>.``), pre-RMSNorm:
  ``attn.norm`` -> ``attn.qkv`` (fused weight [h, g, a/g+2, d], bias [g, a/g+2, d] when
  ``qkv_bias``) -> ``attn.split`` into q [b,s,g,a/g,d], k and v [b,s,g,d] ->
  ``attn.rope_q``, ``attn.rope_k`` -> attention core (block ``attn_core``: scores,
  softmax, context; or one flash kernel) -> ``attn.proj`` (weight [g, a/g, d, h]) ->
  ``attn.residual`` (add) -> ``mlp.norm`` -> ``mlp.gate`` and ``mlp.up`` [h, f] ->
  ``mlp.swiglu`` -> ``mlp.down`` [f, h] -> ``mlp.residual`` (add).
* ``final_norm`` -> ``head`` (``bsh,vh->bsv``; ``head.weight``, or ``wte`` when tied) ->
  ``loss``.
"""

from __future__ import annotations

from fractions import Fraction

from stage_core import sym
from stage_core.ir.builder import GraphBuilder
from stage_core.ir.graph import Graph

from .config import LlamaConfig

RESIDUAL = ("residual",)


def build(config: LlamaConfig) -> Graph:
    """The single-device forward graph of ``config`` (dims in ``graph.dims``; b, s unbound)."""
    c = config
    g = GraphBuilder(
        c.name or "llama",
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
    h, a, kv, d, f, V = sym.dims("h a g d f V")
    r = a / kv  # query heads per group
    c_qkv = r + 2  # the group's query heads, one key head and one value head
    shape = {
        "h": (h,),
        "w_qkv": (h, kv, c_qkv, d),
        "b_qkv": (kv, c_qkv, d),
        "q": ("b", "s", kv, r, d),
        "kv": ("b", "s", kv, d),
        "w_proj": (kv, r, d, h),
        "w_in": (h, f),
        "w_down": (f, h),
    }

    tokens = g.input("tokens", ("b", "s"))
    labels = g.input("labels", ("b", "s"))
    wte = g.param("embed.wte", (V, h))
    x = g.embedding(tokens, wte, name="embed", tags=RESIDUAL)

    for i in range(c.layers):
        with g.layer(i):
            y = g.norm("rmsnorm", x, g.param("attn.norm.weight", shape["h"]), name="attn.norm")
            bias = g.param("attn.qkv.bias", shape["b_qkv"]) if c.qkv_bias else None
            qkv = g.einsum("bsh,hgcd->bsgcd", y, g.param("attn.qkv.weight", shape["w_qkv"]), bias=bias,
                           name="attn.qkv")
            q, k, v = g.split(qkv, "bsgcd->bsgrd,bsgd,bsgd", (shape["q"], shape["kv"], shape["kv"]),
                              name="attn.split")
            q = g.rope(q, name="attn.rope_q")
            k = g.rope(k, name="attn.rope_k")
            ctx = attention_core(g, q, k, v, kind=c.attention, causal_flops=c.causal_flops)
            out = g.einsum("bsgrd,grdh->bsh", ctx, g.param("attn.proj.weight", shape["w_proj"]),
                           name="attn.proj")
            x = g.add(out, x, name="attn.residual", tags=RESIDUAL)

            y = g.norm("rmsnorm", x, g.param("mlp.norm.weight", shape["h"]), name="mlp.norm")
            gate = g.einsum("bsh,hf->bsf", y, g.param("mlp.gate.weight", shape["w_in"]), name="mlp.gate")
            up = g.einsum("bsh,hf->bsf", y, g.param("mlp.up.weight", shape["w_in"]), name="mlp.up")
            u = g.swiglu(gate, up, name="mlp.swiglu")
            z = g.einsum("bsf,fh->bsh", u, g.param("mlp.down.weight", shape["w_down"]), name="mlp.down")
            x = g.add(z, x, name="mlp.residual", tags=RESIDUAL)

    y = g.norm("rmsnorm", x, g.param("final_norm.weight", shape["h"]), name="final_norm")
    head = wte if c.tie_embeddings else g.param("head.weight", (V, h))
    logits = g.einsum("bsh,vh->bsv", y, head, name="head")
    return g.finish(g.cross_entropy(logits, labels, name="loss"))


def attention_core(g: GraphBuilder, q, k, v, *, kind: str, causal_flops: bool):
    """softmax(q·kᵀ)·v in block ``attn_core``: q [b,s,g,r,d], k and v [b,s,g,d] -> [b,s,g,r,d]."""
    with g.block("attn_core"):
        if kind == "flash":
            return g.flash_attention(q, k, v, causal_flops=causal_flops, name="attn.flash")
        scale = Fraction(1, 2) if causal_flops else 1
        scores = g.einsum("bsgrd,bkgd->bgrsk", q, k, name="attn.scores", flops_scale=scale)
        probs = g.softmax(scores, over=-1, name="attn.softmax")
        return g.einsum("bgrsk,bkgd->bsgrd", probs, v, name="attn.context", flops_scale=scale)
