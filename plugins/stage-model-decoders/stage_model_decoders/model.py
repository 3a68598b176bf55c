"""The forward graph of a :class:`DecoderConfig`: one device, forward only, over the plan's ``b`` and ``s``.

Layout (the conventions STAGE's parallel strategies read):

* ``embed``: a lookup of ``embed.wte`` [V, h]; with ``embed_scale`` an ``embed.scale``
  kernel multiplies it by sqrt(h) (Gemma).  Its output is the first residual-stream tensor.
* each layer (``layers.<i>.``), the norms placed by ``norm_placement``:

  - ``pre``: ``attn.norm`` -> attention -> ``attn.residual``; ``mlp.norm`` -> MLP -> ``mlp.residual``.
  - ``sandwich``: as ``pre``, plus ``attn.post_norm`` and ``mlp.post_norm`` on each block's
    output before its residual add (Gemma 2/3).
  - ``post``: attention -> ``attn.post_norm`` -> ``attn.residual``; MLP -> ``mlp.post_norm``
    -> ``mlp.residual`` (OLMo 2).

  Attention is the core's GQA block (``attn.qkv`` [h, g, a/g+2, d], RoPE on q and k,
  the attention core in block ``attn_core``, ``attn.proj`` [g, a/g, d, h]), local
  (the flash kernel reads only the window) in the layers ``is_local`` names, with
  ``attn_softcap`` inside the kernel and with q/k norms per head (``attn.q_norm``,
  ``attn.k_norm`` over d) or over all heads (weights [g, a/g, d] and [g, d]).  The MLP
  is ``mlp.gate``/``mlp.up`` [h, f] -> ``mlp.swiglu`` or ``mlp.geglu`` -> ``mlp.down`` [f, h].
  The post-norms' outputs are residual-stream tensors (under sequence parallel they run
  on s/t tokens, after the reduce-scatter).
* ``final_norm`` -> ``head`` (``embed.wte`` when tied) -> with ``final_softcap`` a
  ``softcap`` kernel on the logits -> ``loss``.
"""

from __future__ import annotations

from stage_core.api import RESIDUAL, Graph, blocks

from .config import DecoderConfig


def build(config: DecoderConfig) -> Graph:
    """The single-device forward graph of ``config`` (dims in ``graph.dims``; b, s unbound)."""
    c = config
    g = blocks.model_builder(c, max_positions=c.max_positions, attention=c.attention,
                             sliding_window=c.sliding_window, local_layers=list(c.local_layers))
    x, labels, wte = blocks.embed(g, tags=() if c.embed_scale else RESIDUAL)
    if c.embed_scale:
        x = g.elementwise("scale", x, name="embed.scale", tags=RESIDUAL)
    post = c.norm_placement in ("sandwich", "post")
    qk_norm = None if c.qk_norm == "none" else "rmsnorm"
    span = "all" if c.qk_norm == "all" else "head"

    for i in range(c.layers):
        with g.layer(i):
            y = x if c.norm_placement == "post" else blocks.norm(g, x, "attn.norm")
            out = blocks.gqa_attention(g, y, kind=c.attention, causal_flops=c.causal_flops, qk_norm=qk_norm,
                                       qk_norm_span=span, rope=True, window=c.sliding_window if c.is_local(i)
                                       else None, softcap=c.attn_softcap)
            if post:
                out = blocks.norm(g, out, "attn.post_norm", tags=RESIDUAL)
            x = g.add(out, x, name="attn.residual", tags=RESIDUAL)

            y = x if c.norm_placement == "post" else blocks.norm(g, x, "mlp.norm")
            out = blocks.swiglu_mlp(g, y, act=c.mlp_act)
            if post:
                out = blocks.norm(g, out, "mlp.post_norm", tags=RESIDUAL)
            x = g.add(out, x, name="mlp.residual", tags=RESIDUAL)

    return blocks.lm_head(g, x, labels, wte, tied=c.tie_embeddings, softcap=c.final_softcap)
