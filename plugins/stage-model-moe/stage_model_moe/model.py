"""The MoE forward graph: one device, forward only, over the plan's dims ``b`` and ``s``.

Layout (the conventions STAGE's parallel strategies read):

* ``embed``: a lookup of ``embed.wte`` [V, h] (no position table: RoPE); its output is
  the first residual-stream tensor.
* each layer (``layers.<i>.``), pre-RMSNorm:

  - attention, GQA: ``attn.norm`` -> ``attn.qkv`` (weight [h, g, a/g+2, d], einsum
    ``bsh,hgcd->bsgcd``, optional bias) -> ``attn.split`` into q [b,s,g,a/g,d], k and v
    [b,s,g,d] -> (``attn.q_norm``, ``attn.k_norm``: per-head RMSNorm over d, Qwen3) ->
    ``attn.q_rope``, ``attn.k_rope`` -> attention core in block ``attn_core`` ->
    ``attn.proj`` (weight [g, a/g, d, h], ``bsgrd,grdh->bsh``) -> ``attn.residual``.
  - attention, MLA (DeepSeek-V3): ``attn.q_a`` [h, rq] -> ``attn.q_a_norm`` ->
    ``attn.q_b`` [rq, a, dn+dr] (or ``attn.q`` [h, a, dn+dr] without a q rank) ->
    split into the no-rope and rope parts, RoPE on the rope part, joined again as q
    [b,s,a,1,dn+dr]; ``attn.kv_a`` [h, rkv+dr] -> split into the latent c_kv [b,s,rkv]
    and the shared rope key k_pe [b,s,dr] -> ``attn.kv_a_norm`` (c_kv),
    ``attn.k_rope`` (k_pe), both declared as the inference cache -> ``attn.kv_b`` [rkv, a, dn+dv] -> split into k_nope and v
    [b,s,a,dv]; k = k_nope joined with k_pe broadcast to every head -> attention core
    (q·k over dn+dr, v over dv) -> ``attn.proj`` [a, dv, h].  The heads dim ``a`` is
    kept on every per-head tensor so tensor parallel can shard it.
  - ``mlp.norm``, then either a dense SwiGLU MLP ``mlp.gate``/``mlp.up`` [h, f],
    ``mlp.swiglu``, ``mlp.down`` [f, h]; or a MoE block: ``moe.router_logits``
    (``bsh,he->bse``, weight [h, E]) -> ``moe.router`` (fused scores + top-k, dense
    routing weights [b,s,E]) -> ``moe.dispatch`` ([b,s,h] -> [E, c, h]) ->
    ``moe.experts.gate``/``.up`` ([E, h, fe], ``ech,ehf->ecf``, tagged ``expert``) ->
    ``moe.experts.swiglu`` -> ``moe.experts.down`` ([E, fe, h]) -> ``moe.combine``
    ([E, c, h] -> [b,s,h]); plus, with shared experts, a dense SwiGLU MLP of width fs
    (``moe.shared.*``, optionally scaled by ``sigmoid(moe.shared_gate)``) added by
    ``moe.add_shared``; then ``mlp.residual``.
* ``final_norm`` -> ``head`` (``bsh,vh->bsv``, [V, h]; ``embed.wte`` when tied) -> ``loss``.

The capacity c of every expert is b·s·k·cf/E (cf = capacity_factor, 1 when dropless),
an exact expression of the dims, so expert FLOPs are exactly k/E of the tokens' rows
per expert under uniform routing.  It need not be whole: lowering spreads the rows
over the experts in whole numbers (E·c, the total, is whole) and, with a capacity
factor, rounds each rank's capacity up as Megatron does.

Embedding, norms, GQA attention, the dense SwiGLU MLPs and the head are the core's
standard blocks (:mod:`stage_core.ir.blocks`); MLA and the MoE block are this plugin's.
"""

from __future__ import annotations

import sympy as sp

from stage_core.api import RESIDUAL, Graph, GraphBuilder, blocks, sym

from .config import MoEConfig

EXPERT = ("expert",)


def build(config: MoEConfig) -> Graph:
    """The single-device forward graph of ``config`` (dims in ``graph.dims``; b, s unbound)."""
    c = config
    g = blocks.model_builder(
        c,
        arch=c.arch,
        attention=c.attention,
        attention_type=c.attention_type,
        experts=c.experts,
        experts_per_token=c.experts_per_token,
        capacity_factor=c.capacity_factor,
        moe_layers=list(c.moe_layers),
        dense_layers=[i for i in range(c.layers) if not c.is_moe_layer(i)],
        kv_cache_elements_per_token_per_layer=c.kv_cache_elements_per_token_per_layer,
        max_positions=c.max_positions,
        mtp_layers_not_built=c.mtp_layers,
        sliding_window=c.sliding_window,
        local_layers=[i for i in range(c.layers) if c.is_local(i)],
    )
    x, labels, wte = blocks.embed(g, tags=RESIDUAL)

    attention = _MLA(c) if c.attention_type == "mla" else _gqa
    for i in range(c.layers):
        with g.layer(i):
            y = blocks.norm(g, x, "attn.norm", c.norm, bias=c.norm_bias)
            out = attention(g, c, y, i)
            bias = [g.param("attn.proj.bias", (sym.dim("h"),))] if c.proj_bias else []
            x = g.elementwise("add", x, out, *bias, spec="bsh,bsh" + ",h" * len(bias) + "->bsh",
                              name="attn.residual", tags=RESIDUAL)
            y = blocks.norm(g, x, "mlp.norm", c.norm, bias=c.norm_bias)
            out = moe_block(g, c, y) if c.is_moe_layer(i) else blocks.swiglu_mlp(g, y)
            x = g.add(x, out, name="mlp.residual", tags=RESIDUAL)

    return blocks.lm_head(g, x, labels, wte, norm_kind=c.norm, norm_bias=c.norm_bias, tied=c.tie_embeddings,
                          bias=c.lm_head_bias)


# ---------------------------------------------------------------------- attention
def _gqa(g: GraphBuilder, c: MoEConfig, y, i: int):
    """Grouped-query attention with a fused QKV projection (Mixtral, Qwen-MoE, gpt-oss, Llama 4); no
    attention dropout; local in the layers ``c.is_local`` names."""
    local = c.is_local(i)
    return blocks.gqa_attention(g, y, kind=c.attention, causal_flops=c.causal_flops, qkv_bias=c.qkv_bias,
                                qk_norm="rmsnorm" if c.qk_norm else None, qk_norm_span=c.qk_norm_span,
                                rope=local or c.sliding_window is None or c.rope_global,
                                window=c.sliding_window if local else None, sinks=c.attn_sinks)


class _MLA:
    """DeepSeek multi-head latent attention: the training form (keys and values decompressed
    per head) or, with ``mla_absorbed``, the form decode runs (attention over the latent)."""

    def __init__(self, c: MoEConfig):
        h, a, rkv, dn, dr, dv = sym.dims("h a rkv dn dr dv")
        one = sp.Integer(1)
        self.shape = {
            "w_q_a": (h, sym.dim("rq")) if c.q_lora_rank is not None else None,
            "w_q_b": ((sym.dim("rq") if c.q_lora_rank is not None else h), a, dn + dr),
            "q": ("b", "s", a, dn + dr),
            "q5": ("b", "s", a, one, dn + dr),
            "q_nope": ("b", "s", a, one, dn),
            "q_pe": ("b", "s", a, one, dr),
            "w_kv_a": (h, rkv + dr),
            "c_kv": ("b", "s", rkv),
            "k_pe": ("b", "s", dr),
            "w_kv_b": (rkv, a, dn + dv),
            "k_nope": ("b", "s", a, dn),
            "k": ("b", "s", a, dn + dr),
            "v": ("b", "s", a, dv),
            "w_proj": (a, dv, h),
        }

    def __call__(self, g: GraphBuilder, c: MoEConfig, y, i: int = 0):
        shape = self.shape
        if c.q_lora_rank is not None:
            q = g.einsum("bsh,hq->bsq", y, g.param("attn.q_a.weight", shape["w_q_a"]), name="attn.q_a")
            q = blocks.norm(g, q, "attn.q_a_norm")
            q = g.einsum("bsq,qaz->bsaz", q, g.param("attn.q_b.weight", shape["w_q_b"]), name="attn.q_b")
        else:
            q = g.einsum("bsh,haz->bsaz", y, g.param("attn.q.weight", shape["w_q_b"]), name="attn.q")
        # one query per head: the size-1 letter r of the attention kernels' q [b,s,g,r,d]
        q = g.view(q, "bsaz->bsarz", shape["q5"], name="attn.q_heads")
        q_nope, q_pe = g.split(q, "bsarz->bsarn,bsarp", (shape["q_nope"], shape["q_pe"]), name="attn.q_split")
        q_pe = g.rope(q_pe, name="attn.q_rope")
        q = g.concat([q_nope, q_pe], "bsarn,bsarp->bsarz", shape["q5"], name="attn.q_join")

        kv = g.einsum("bsh,hx->bsx", y, g.param("attn.kv_a.weight", shape["w_kv_a"]), name="attn.kv_a")
        c_kv, k_pe = g.split(kv, "bsx->bsc,bsp", (shape["c_kv"], shape["k_pe"]), name="attn.kv_a_split")
        c_kv = blocks.norm(g, c_kv, "attn.kv_a_norm")
        k_pe = g.rope(k_pe, name="attn.k_rope")
        # inference caches the normed latent and the rope key (rkv + dr per token), not K and V
        c_kv = g.cache(c_kv, name="attn.latent_cache")
        k_pe = g.cache(k_pe, name="attn.k_rope_cache")
        w_kv_b = g.param("attn.kv_b.weight", shape["w_kv_b"])
        if c.mla_absorbed:
            ctx = self.absorbed(g, c, q_nope, q_pe, c_kv, k_pe, w_kv_b)
        else:
            kv = g.einsum("bsc,cay->bsay", c_kv, w_kv_b, name="attn.kv_b")
            k_nope, v = g.split(kv, "bsay->bsan,bsav", (shape["k_nope"], shape["v"]), name="attn.kv_b_split")
            k = g.concat([k_nope, k_pe], "bsan,bsp->bsaz", shape["k"], name="attn.k_join")
            ctx = blocks.attention_core(g, q, k, v, kind=c.attention, causal_flops=c.causal_flops)
            ctx = g.view(ctx, "bsarv->bsav", shape["v"], name="attn.ctx_heads")
        return g.einsum("bsav,avh->bsh", ctx, g.param("attn.proj.weight", shape["w_proj"]), name="attn.proj")

    def absorbed(self, g: GraphBuilder, c: MoEConfig, q_nope, q_pe, c_kv, k_pe, w_kv_b):
        """Attention over the latent: q_nope·W_ukᵀ joined with q_pe is each head's query
        [rkv + dr]; one key per token (the latent joined with the rope key) and one value
        (the latent, the key's leading part) serve every head, as one KV group; the context
        [rkv] per head goes through W_uv.  [b,s,a,1,dn] ... -> [b,s,a,dv]."""
        a, rkv, dn, dr, dv = sym.dims("a rkv dn dr dv")
        one = sp.Integer(1)
        w_uk, w_uv = g.split(w_kv_b, "cay->can,cav", ((rkv, a, dn), (rkv, a, dv)), name="attn.kv_b_split")
        q_lat = g.einsum("bsarn,can->bsarc", q_nope, w_uk, name="attn.q_absorb")
        q = g.concat([q_lat, q_pe], "bsarc,bsarp->bsarz", ("b", "s", a, one, rkv + dr), name="attn.q_join_latent")
        q = g.view(q, "bsarz->bsraz", ("b", "s", one, a, rkv + dr), name="attn.q_group")
        k = g.concat([c_kv, k_pe], "bsc,bsp->bsz", ("b", "s", rkv + dr), name="attn.k_join_latent")
        k = g.view(k, "bsz->bsgz", ("b", "s", one, rkv + dr), name="attn.k_group")
        v = g.view(c_kv, "bsc->bsgc", ("b", "s", one, rkv), name="attn.v_group")
        ctx = blocks.attention_core(g, q, k, v, kind=c.attention, causal_flops=c.causal_flops,
                                    value_in_key=c.attention == "flash")
        ctx = g.view(ctx, "bsgac->bsac", ("b", "s", a, rkv), name="attn.ctx_heads")
        return g.einsum("bsac,cav->bsav", ctx, w_uv, name="attn.v_absorb")


# ---------------------------------------------------------------------- MoE
def moe_block(g: GraphBuilder, c: MoEConfig, y):
    """Router, dispatch, SwiGLU experts, combine (and the shared experts): [b,s,h] -> [b,s,h]."""
    h, E, k, fe = sym.dims("h E k fe")
    router_bias = g.param("moe.router.bias", (E,)) if c.router_bias else None
    logits = g.einsum("bsh,he->bse", y, g.param("moe.router.weight", (h, E)), bias=router_bias,
                      name="moe.router_logits")
    weights = g.router(logits, k=k, score=c.router_score, normalize=c.norm_topk_prob,
                       scale=c.routed_scaling_factor, selection_bias=c.router_selection_bias, name="moe.router")
    xe = g.dispatch(y, weights, k=k, capacity_factor=c.capacity_factor, name="moe.dispatch")

    def expert(name: str, x, spec: str, shape, out_dim):
        z = g.einsum(spec, x, g.param(f"moe.experts.{name}.weight", shape, tags=EXPERT), name=f"moe.experts.{name}")
        if c.expert_bias:  # gpt-oss: every expert projection has a bias
            z = g.elementwise("add", z, g.param(f"moe.experts.{name}.bias", (E, out_dim), tags=EXPERT),
                              spec="ecx,ex->ecx", name=f"moe.experts.{name}_bias")
        return z

    gate = expert("gate", xe, "ech,ehf->ecf", (E, h, fe), fe)
    up = expert("up", xe, "ech,ehf->ecf", (E, h, fe), fe)
    act = g.swiglu(gate, up, name="moe.experts.swiglu")
    ye = expert("down", act, "ecf,efh->ech", (E, fe, h), h)
    out = g.combine(ye, weights, k=k, name="moe.combine")
    if c.shared_expert_ffn_hidden:
        shared = blocks.swiglu_mlp(g, y, sym.dim("fs"), prefix="moe.shared")
        if c.shared_expert_gate:
            gl = g.einsum("bsh,h->bs", y, g.param("moe.shared_gate.weight", (h,)), name="moe.shared_gate")
            gl = g.elementwise("sigmoid", gl, name="moe.shared_gate_sigmoid")
            shared = g.elementwise("mul", shared, gl, spec="bsh,bs->bsh", name="moe.shared_scale")
        out = g.add(out, shared, name="moe.add_shared")
    return out
