"""The Llama-shaped forward graph: one device, forward only, over the plan's dims ``b`` and ``s``.

Layout (the conventions STAGE's parallel strategies read):

* embedding: a lookup of ``wte`` [V, h] (no positions table); with ``embed_multiplier``
  an ``embed.scale`` kernel.  Its output is the first residual-stream tensor.
* each layer (``layers.<i>.``), pre-norm (``norm``: RMSNorm or LayerNorm, a bias with
  ``norm_bias``):
  ``attn.norm`` -> ``attn.qkv`` (fused weight [h, g, a/g+2, d], bias [g, a/g+2, d] when
  ``qkv_bias``) -> ``attn.split`` into q [b,s,g,a/g,d], k and v [b,s,g,d] -> with
  ``qk_norm="head"`` ``attn.q_norm`` and ``attn.k_norm`` (RMSNorm over d) -> with RoPE
  ``attn.rope_q``, ``attn.rope_k`` -> attention core (block ``attn_core``: scores,
  softmax, context; or one flash kernel) -> ``attn.proj`` (weight [g, a/g, d, h]) ->
  ``attn.residual`` (the add, with ``attn.proj.bias`` [h] when ``proj_bias``) ->
  ``mlp.norm`` -> the MLP -> ``mlp.residual`` (with ``mlp.down.bias`` when ``mlp_bias``).
  The MLP is ``mlp.gate`` and ``mlp.up`` [h, f] -> ``mlp.swiglu`` (or ``mlp.geglu``) ->
  ``mlp.down`` [f, h]; or with ``mlp_act="gelu"`` ``mlp.up`` -> ``mlp.gelu`` ->
  ``mlp.down``.  Biases of gate and up ride in their einsums.
* with ``parallel_block`` attention and MLP read the same input: ``attn.norm`` (and
  ``mlp.norm`` with two norms) of the layer's input, and one ``residual`` kernel adds both
  outputs (and their biases) to it: under tensor parallel one reduction for both, as
  Falcon and Cohere run it.
* ``final_norm`` -> ``head`` (``bsh,vh->bsv``; ``head.weight``, or ``wte`` when tied) ->
  ``loss``.

The blocks are the core's standard ones (:mod:`stage_core.ir.blocks`).
"""

from __future__ import annotations

from stage_core.api import RESIDUAL, Graph, blocks, sym

from .config import LlamaConfig


def build(config: LlamaConfig) -> Graph:
    """The single-device forward graph of ``config`` (dims in ``graph.dims``; b, s unbound)."""
    c = config
    g = blocks.model_builder(c, max_positions=c.max_positions, attention=c.attention,
                             sliding_window=c.sliding_window)
    x, labels, wte = blocks.embed(g, tags=() if c.embed_multiplier else RESIDUAL)
    if c.embed_multiplier:
        x = g.elementwise("scale", x, name="embed.scale", tags=RESIDUAL)

    for i in range(c.layers):
        with g.layer(i):
            y = _norm(g, c, x, "attn.norm")
            attn = blocks.gqa_attention(g, y, kind=c.attention, causal_flops=c.causal_flops, qkv_bias=c.qkv_bias,
                                        qk_norm="rmsnorm" if c.qk_norm == "head" else None,
                                        rope=c.position == "rope", rope_names=("rope_q", "rope_k"),
                                        window=c.sliding_window)
            attn_bias = [g.param("attn.proj.bias", (sym.dim("h"),))] if c.proj_bias else []
            if c.parallel_block:
                z = _mlp(g, c, _norm(g, c, x, "mlp.norm") if c.parallel_norms == 2 else y)
                x = _residual(g, [attn, z], x, attn_bias + _mlp_out_bias(g, c), "residual")
            else:
                x = _residual(g, [attn], x, attn_bias, "attn.residual")
                z = _mlp(g, c, _norm(g, c, x, "mlp.norm"))
                x = _residual(g, [z], x, _mlp_out_bias(g, c), "mlp.residual")

    return blocks.lm_head(g, x, labels, wte, norm_kind=c.norm, norm_bias=c.norm_bias, tied=c.tie_embeddings)


def _norm(g, c: LlamaConfig, x, name: str):
    return blocks.norm(g, x, name, c.norm, bias=c.norm_bias)


def _residual(g, outs, x, biases, name: str):
    """``x`` plus the blocks' outputs and biases, one kernel (a bias joins the reduction
    of a tensor-parallel output as a term one rank keeps)."""
    ins = [*outs, *biases, x]
    spec = ",".join(["bsh"] * len(outs) + ["h"] * len(biases) + ["bsh"]) + "->bsh"
    return g.elementwise("add", *ins, spec=spec, name=name, tags=RESIDUAL)


def _mlp_out_bias(g, c: LlamaConfig) -> list:
    return [g.param("mlp.down.bias", (sym.dim("h"),))] if c.mlp_bias else []


def _mlp(g, c: LlamaConfig, y):
    """The MLP without its output bias (the residual kernel adds it)."""
    h, f = sym.dims("h f")

    def proj(name: str):
        bias = g.param(f"{name}.bias", (f,)) if c.mlp_bias else None
        return g.einsum("bsh,hf->bsf", y, g.param(f"{name}.weight", (h, f)), bias=bias, name=name)

    with g.scope("mlp"):
        if c.mlp_act == "gelu":
            u = g.gelu(proj("up"), name="gelu")
        else:
            u = g.elementwise(c.mlp_act, proj("gate"), proj("up"), name=c.mlp_act)
        return g.einsum("bsf,fh->bsh", u, g.param("down.weight", (f, h)), name="down")
