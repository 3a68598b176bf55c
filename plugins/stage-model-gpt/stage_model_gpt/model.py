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

The blocks are the core's standard ones (:mod:`stage_core.ir.blocks`).
"""

from __future__ import annotations

from stage_core.api import RESIDUAL, Graph, blocks, sym

from .config import GPTConfig


def build(config: GPTConfig) -> Graph:
    """The single-device forward graph of ``config`` (dims in ``graph.dims``; b, s unbound)."""
    c = config
    g = blocks.model_builder(c, max_positions=c.max_positions, attention=c.attention)
    h = sym.dim("h")
    x, labels, wte = blocks.embed(g, positions=True, tags=())  # adds the first s rows of wpe
    x = g.dropout(x, name="embed.dropout", tags=RESIDUAL)

    for i in range(c.layers):
        with g.layer(i):
            y = blocks.norm(g, x, "attn.norm", "layernorm", bias=True)
            out = blocks.gqa_attention(g, y, kind=c.attention, causal_flops=c.causal_flops, dropout=True,
                                       qkv_bias=True)
            x = g.dropout_add(out, x, g.param("attn.proj.bias", (h,)), name="attn.residual", tags=RESIDUAL)

            y = blocks.norm(g, x, "mlp.norm", "layernorm", bias=True)
            z = blocks.gelu_mlp(g, y)
            x = g.dropout_add(z, x, g.param("mlp.fc2.bias", (h,)), name="mlp.residual", tags=RESIDUAL)

    return blocks.lm_head(g, x, labels, wte, norm_kind="layernorm", norm_bias=True, tied=c.tie_embeddings)
