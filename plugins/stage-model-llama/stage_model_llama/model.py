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

The blocks are the core's standard ones (:mod:`stage_core.ir.blocks`).
"""

from __future__ import annotations

from stage_core.api import RESIDUAL, Graph, blocks

from .config import LlamaConfig


def build(config: LlamaConfig) -> Graph:
    """The single-device forward graph of ``config`` (dims in ``graph.dims``; b, s unbound)."""
    c = config
    g = blocks.model_builder(c, max_positions=c.max_positions, attention=c.attention,
                             sliding_window=c.sliding_window)
    x, labels, wte = blocks.embed(g, tags=RESIDUAL)

    for i in range(c.layers):
        with g.layer(i):
            y = blocks.norm(g, x, "attn.norm")
            out = blocks.gqa_attention(g, y, kind=c.attention, causal_flops=c.causal_flops, qkv_bias=c.qkv_bias,
                                       rope=True, rope_names=("rope_q", "rope_k"), window=c.sliding_window)
            x = g.add(out, x, name="attn.residual", tags=RESIDUAL)

            y = blocks.norm(g, x, "mlp.norm")
            z = blocks.swiglu_mlp(g, y)
            x = g.add(z, x, name="mlp.residual", tags=RESIDUAL)

    return blocks.lm_head(g, x, labels, wte, tied=c.tie_embeddings)
