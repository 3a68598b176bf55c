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
    ``attn.k_rope`` (k_pe) -> ``attn.kv_b`` [rkv, a, dn+dv] -> split into k_nope and v
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
per expert under uniform routing.
"""

from __future__ import annotations

from fractions import Fraction

import sympy as sp

from stage_core import sym
from stage_core.ir.builder import GraphBuilder
from stage_core.ir.graph import Graph

from .config import MoEConfig

RESIDUAL = ("residual",)
EXPERT = ("expert",)


def build(config: MoEConfig) -> Graph:
    """The single-device forward graph of ``config`` (dims in ``graph.dims``; b, s unbound)."""
    c = config
    g = GraphBuilder(
        c.name or "moe",
        dims=c.dims(),
        dtype=c.dtype,
        meta={
            "family": c.family,
            "arch": c.arch,
            "layers": c.layers,
            "seq_len": c.seq_len,
            "attention": c.attention,
            "attention_type": c.attention_type,
            "experts": c.experts,
            "experts_per_token": c.experts_per_token,
            "capacity_factor": c.capacity_factor,
            "moe_layers": list(c.moe_layers),
            "dense_layers": [i for i in range(c.layers) if not c.is_moe_layer(i)],
            "kv_cache_elements_per_token_per_layer": c.kv_cache_elements_per_token_per_layer,
            "mtp_layers_not_built": c.mtp_layers,
        },
    )
    h, V = sym.dims("h V")
    tokens = g.input("tokens", ("b", "s"))
    labels = g.input("labels", ("b", "s"))
    wte = g.param("embed.wte", (V, h))
    x = g.embedding(tokens, wte, name="embed", tags=RESIDUAL)

    attention = _MLA(c) if c.attention_type == "mla" else _GQA(c)
    for i in range(c.layers):
        with g.layer(i):
            y = g.norm("rmsnorm", x, g.param("attn.norm.weight", (h,)), name="attn.norm")
            out = attention(g, y)
            x = g.add(x, out, name="attn.residual", tags=RESIDUAL)
            y = g.norm("rmsnorm", x, g.param("mlp.norm.weight", (h,)), name="mlp.norm")
            out = moe_block(g, c, y) if c.is_moe_layer(i) else swiglu_mlp(g, y, "mlp", sym.dim("f"))
            x = g.add(x, out, name="mlp.residual", tags=RESIDUAL)

    y = g.norm("rmsnorm", x, g.param("final_norm.weight", (h,)), name="final_norm")
    head = wte if c.tie_embeddings else g.param("head.weight", (V, h))
    logits = g.einsum("bsh,vh->bsv", y, head, name="head")
    return g.finish(g.cross_entropy(logits, labels, name="loss"))


# ---------------------------------------------------------------------- attention
def attention_core(g: GraphBuilder, q, k, v, *, kind: str, causal_flops: bool):
    """softmax(q·kᵀ)·v in block ``attn_core``: q [b,s,g,r,d], k [b,s,g,d], v [b,s,g,dv] -> [b,s,g,r,dv].

    ``flash`` keeps q, k, v, the output and the log-sum-exp; ``classic`` keeps the s×s
    probabilities for backward.  No attention dropout (none of these models uses it).
    """
    with g.block("attn_core"):
        if kind == "flash":
            return g.flash_attention(q, k, v, causal_flops=causal_flops, name="attn.flash")
        scale = Fraction(1, 2) if causal_flops else 1
        scores = g.einsum("bsgrd,bkgd->bgrsk", q, k, name="attn.scores", flops_scale=scale)
        probs = g.softmax(scores, over=-1, name="attn.softmax")
        return g.einsum("bgrsk,bkgv->bsgrv", probs, v, name="attn.context", flops_scale=scale)


class _GQA:
    """Grouped-query attention with a fused QKV projection (Mixtral, Qwen-MoE)."""

    def __init__(self, c: MoEConfig):
        self.c = c
        h, a, kv, d = sym.dims("h a g d")
        r = a / kv  # query heads per group
        self.shape = {
            "w_qkv": (h, kv, r + 2, d),
            "b_qkv": (kv, r + 2, d),
            "q": ("b", "s", kv, r, d),
            "kv": ("b", "s", kv, d),
            "d": (d,),
            "w_proj": (kv, r, d, h),
        }

    def __call__(self, g: GraphBuilder, y):
        c, shape = self.c, self.shape
        bias = g.param("attn.qkv.bias", shape["b_qkv"]) if c.qkv_bias else None
        qkv = g.einsum("bsh,hgcd->bsgcd", y, g.param("attn.qkv.weight", shape["w_qkv"]), bias=bias,
                       name="attn.qkv")
        q, k, v = g.split(qkv, "bsgcd->bsgrd,bsgd,bsgd", (shape["q"], shape["kv"], shape["kv"]),
                          name="attn.split")
        if c.qk_norm:
            q = g.norm("rmsnorm", q, g.param("attn.q_norm.weight", shape["d"]), name="attn.q_norm")
            k = g.norm("rmsnorm", k, g.param("attn.k_norm.weight", shape["d"]), name="attn.k_norm")
        q = g.rope(q, name="attn.q_rope")
        k = g.rope(k, name="attn.k_rope")
        ctx = attention_core(g, q, k, v, kind=c.attention, causal_flops=c.causal_flops)
        return g.einsum("bsgrd,grdh->bsh", ctx, g.param("attn.proj.weight", shape["w_proj"]), name="attn.proj")


class _MLA:
    """DeepSeek multi-head latent attention (training form: keys and values decompressed per head)."""

    def __init__(self, c: MoEConfig):
        self.c = c
        h, a, rkv, dn, dr, dv = sym.dims("h a rkv dn dr dv")
        one = sp.Integer(1)
        self.shape = {
            "w_q_a": (h, sym.dim("rq")) if c.q_lora_rank is not None else None,
            "rq": (sym.dim("rq"),) if c.q_lora_rank is not None else None,
            "w_q_b": ((sym.dim("rq") if c.q_lora_rank is not None else h), a, dn + dr),
            "q": ("b", "s", a, dn + dr),
            "q5": ("b", "s", a, one, dn + dr),
            "q_nope": ("b", "s", a, one, dn),
            "q_pe": ("b", "s", a, one, dr),
            "w_kv_a": (h, rkv + dr),
            "c_kv": ("b", "s", rkv),
            "k_pe": ("b", "s", dr),
            "rkv": (rkv,),
            "w_kv_b": (rkv, a, dn + dv),
            "k_nope": ("b", "s", a, dn),
            "k": ("b", "s", a, dn + dr),
            "v": ("b", "s", a, dv),
            "w_proj": (a, dv, h),
        }

    def __call__(self, g: GraphBuilder, y):
        c, shape = self.c, self.shape
        if c.q_lora_rank is not None:
            q = g.einsum("bsh,hq->bsq", y, g.param("attn.q_a.weight", shape["w_q_a"]), name="attn.q_a")
            q = g.norm("rmsnorm", q, g.param("attn.q_a_norm.weight", shape["rq"]), name="attn.q_a_norm")
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
        c_kv = g.norm("rmsnorm", c_kv, g.param("attn.kv_a_norm.weight", shape["rkv"]), name="attn.kv_a_norm")
        k_pe = g.rope(k_pe, name="attn.k_rope")
        kv = g.einsum("bsc,cay->bsay", c_kv, g.param("attn.kv_b.weight", shape["w_kv_b"]), name="attn.kv_b")
        k_nope, v = g.split(kv, "bsay->bsan,bsav", (shape["k_nope"], shape["v"]), name="attn.kv_b_split")
        k = g.concat([k_nope, k_pe], "bsan,bsp->bsaz", shape["k"], name="attn.k_join")

        ctx = attention_core(g, q, k, v, kind=c.attention, causal_flops=c.causal_flops)
        ctx = g.view(ctx, "bsarv->bsav", shape["v"], name="attn.ctx_heads")
        return g.einsum("bsav,avh->bsh", ctx, g.param("attn.proj.weight", shape["w_proj"]), name="attn.proj")


# ---------------------------------------------------------------------- MLPs
def swiglu_mlp(g: GraphBuilder, y, prefix: str, width, tags=()):
    """Dense SwiGLU MLP: down(silu(y·gate) * (y·up)), weights [h, width], [h, width], [width, h]."""
    h = sym.dim("h")
    gate = g.einsum("bsh,hf->bsf", y, g.param(f"{prefix}.gate.weight", (h, width), tags=tags), name=f"{prefix}.gate")
    up = g.einsum("bsh,hf->bsf", y, g.param(f"{prefix}.up.weight", (h, width), tags=tags), name=f"{prefix}.up")
    act = g.swiglu(gate, up, name=f"{prefix}.swiglu")
    return g.einsum("bsf,fh->bsh", act, g.param(f"{prefix}.down.weight", (width, h), tags=tags),
                    name=f"{prefix}.down")


def moe_block(g: GraphBuilder, c: MoEConfig, y):
    """Router, dispatch, SwiGLU experts, combine (and the shared experts): [b,s,h] -> [b,s,h]."""
    h, E, k, fe = sym.dims("h E k fe")
    logits = g.einsum("bsh,he->bse", y, g.param("moe.router.weight", (h, E)), name="moe.router_logits")
    weights = g.router(logits, k=k, score=c.router_score, normalize=c.norm_topk_prob,
                       scale=c.routed_scaling_factor, selection_bias=c.router_selection_bias, name="moe.router")
    xe = g.dispatch(y, weights, k=k, capacity_factor=c.capacity_factor, name="moe.dispatch")
    gate = g.einsum("ech,ehf->ecf", xe, g.param("moe.experts.gate.weight", (E, h, fe), tags=EXPERT),
                    name="moe.experts.gate")
    up = g.einsum("ech,ehf->ecf", xe, g.param("moe.experts.up.weight", (E, h, fe), tags=EXPERT),
                  name="moe.experts.up")
    act = g.swiglu(gate, up, name="moe.experts.swiglu")
    ye = g.einsum("ecf,efh->ech", act, g.param("moe.experts.down.weight", (E, fe, h), tags=EXPERT),
                  name="moe.experts.down")
    out = g.combine(ye, weights, k=k, name="moe.combine")
    if c.shared_expert_ffn_hidden:
        shared = swiglu_mlp(g, y, "moe.shared", sym.dim("fs"))
        if c.shared_expert_gate:
            gl = g.einsum("bsh,h->bs", y, g.param("moe.shared_gate.weight", (h,)), name="moe.shared_gate")
            gl = g.elementwise("sigmoid", gl, name="moe.shared_gate_sigmoid")
            shared = g.elementwise("mul", shared, gl, spec="bsh,bs->bsh", name="moe.shared_scale")
        out = g.add(out, shared, name="moe.add_shared")
    return out
