"""The forward graph of a :class:`HybridConfig`: one device, forward only, over the plan's ``b`` and ``s``.

* ``embed``: a lookup of ``embed.wte`` [V, h] (no positions); the first residual-stream tensor.
* each layer ``layers.<i>.`` (one pattern character), pre-RMSNorm ``<kind>.norm`` and a
  residual add ``<kind>.residual``:

  - ``M`` Mamba-2 (``mamba.``), as Megatron-Core's MambaMixer: ``in_proj`` (``bsh,hge->bsge``,
    weight [h, mg, e] with e = 2·r·mp + 2·mn + r per group, r = mh/mg heads per group) ->
    ``in_split`` into z [b,s,mg,r,mp], xBC [b,s,mg,c] (c = r·mp + 2·mn) and dt
    [b,s,mg,r] -> ``conv1d`` (depthwise causal, SiLU fused; weight [mg, c, mk], bias
    [mg, c]) -> ``conv_split`` into x [b,s,mg,r,mp], B and C [b,s,mg,mn] -> ``ssd``
    (the chunked SSD scan, :meth:`GraphBuilder.ssd_scan`; A_log, D and dt_bias [mg, r],
    A_log and D fp32) -> ``norm_gated`` (RMSNorm of y·silu(z) over each group's r·mp
    values, weight [mg, r, mp]) -> ``out_proj`` (``bsgrp,grph->bsh``, [mg, r, mp, h]).
    Every weight but out_proj's output side carries the group dim ``mg``, so tensor
    parallel shards heads and groups together (each rank whole groups with their heads,
    Megatron's ngroups % tp == 0) and out_proj is row parallel: one reduction per layer.
  - ``*`` attention (``attn.``): the core's GQA block, RoPE when ``rope``.
  - ``-`` MLP (``mlp.``): ``up`` [h, f] -> ``relu2`` -> ``down`` [f, h], or SwiGLU.
  - ``E`` MoE (``moe.``): ``router_logits`` [h, E] -> ``router`` -> ``dispatch`` -> experts
    ([E, h, fe] up (and gate), [E, fe, h] down, tagged ``expert``) -> ``combine``; a
    shared expert (``moe.shared.*``) added when ``shared_expert_ffn_hidden`` > 0.
  - ``H`` Zamba2 hybrid (``shared.`` then ``mamba.``), as transformers' Zamba2HybridLayer:
    the shared transformer block ``H`` layer j uses is block j mod ``shared_blocks``, its
    weights ``shared.<k>.*`` made once and read by every use (FLOPs at every use,
    parameters once; under pipeline parallel a block used on several stages is held by
    each and its gradients summed over them, as a tied embedding's are).  The block:
    ``concat`` of the residual stream and the embeddings (``embed``'s output, sent from
    the first stage to each stage that uses it) -> ``input_norm`` [2h] -> ``qkv``
    ([2h, g, a/g+2, d]; with ``shared_attn_adapter`` a per-use ``attn_adapter.down``
    [2h, 3, lr] and ``attn_adapter.{q,k,v}_up`` added to q, k, v) -> RoPE when ``rope``
    -> k and v cached -> the attention core -> ``proj`` [g, a/g, d, h] -> ``ffn_norm``
    [h] -> ``gate_up`` [h, 2, f] (with ``shared_mlp_adapter`` a per-use
    ``mlp_adapter.down`` [h, lr] and ``mlp_adapter.up`` [lr, 2, f] added) -> ``geglu``
    (or ``swiglu``) -> ``down`` [f, h] -> the per-use ``linear`` [h, h].  No residual
    inside the block: its output joins the Mamba mixer's input (``mamba.shared_add``,
    before ``mamba.norm``), and the layer's residual add is the mixer's alone.
* ``final_norm`` -> ``head`` (``embed.wte`` when tied) -> ``loss``.
"""

from __future__ import annotations

from stage_core.api import RESIDUAL, Graph, GraphBuilder, Tensor, blocks, sym

from .config import LAYER_KINDS, HybridConfig
from .scan import SELECTIVE_SCAN

#: the registered kernels these families' graphs call (their ModelSpec.kernels)
KERNELS = (SELECTIVE_SCAN,)

EXPERT = ("expert",)


def build(config: HybridConfig) -> Graph:
    """The single-device forward graph of ``config`` (dims in ``graph.dims``; b, s unbound)."""
    c = config
    g = blocks.model_builder(
        c,
        kernels=KERNELS,
        pattern=c.pattern,
        max_positions=c.max_positions,
        attention=c.attention,
        mamba_layers=list(c.mixer_indices),
        attention_layers=list(c.layer_indices("attention")),
        shared_block_layers=list(c.layer_indices("hybrid")),
        ssm_state_elements_per_layer=c.ssm_state_elements,
        conv_state_elements_per_layer=c.conv_state_elements,
        chunk_size=c.chunk_size,
        **({"experts": c.experts, "experts_per_token": c.experts_per_token} if "E" in c.pattern else {}),
    )
    x, labels, wte = blocks.embed(g, tags=RESIDUAL)
    embeddings = x
    shared = [_shared_weights(g, k) for k in range(c.shared_blocks)] if "H" in c.pattern else []
    uses = 0
    for i, ch in enumerate(c.pattern):
        kind = LAYER_KINDS[ch]
        with g.layer(i // c.blocks_per_layer):
            if kind == "hybrid":
                t = _shared_block(g, c, x, embeddings, shared[uses % c.shared_blocks])
                uses += 1
                y = blocks.norm(g, g.add(x, t, name="mamba.shared_add"), "mamba.norm")
                x = g.add(_mamba(g, c, y), x, name="mamba.residual", tags=RESIDUAL)
                continue
            prefix, block = LAYERS[kind]
            y = blocks.norm(g, x, f"{prefix}.norm")
            x = g.add(block(g, c, y), x, name=f"{prefix}.residual", tags=RESIDUAL)
    return blocks.lm_head(g, x, labels, wte, tied=c.tie_embeddings)


def _mamba(g: GraphBuilder, c: HybridConfig, y: Tensor) -> Tensor:
    if c.ssm_version == 1:
        return _mamba1(g, c, y)
    h, G, H, P, N, K = sym.dims("h mg mh mp mn mk")
    r = H / G
    with g.scope("mamba"):
        zxbcdt = g.einsum("bsh,hge->bsge", y, g.param("in_proj.weight", (h, G, 2 * r * P + 2 * N + r)),
                          name="in_proj")
        z, xbc, dt = g.split(zxbcdt, "bsge->bsgrp,bsgc,bsgr", (("b", "s", G, r, P), ("b", "s", G, r * P + 2 * N),
                                                                ("b", "s", G, r)), name="in_split")
        xbc, conv_state = g.causal_conv1d(xbc, g.param("conv1d.weight", (G, r * P + 2 * N, K)),
                                          g.param("conv1d.bias", (G, r * P + 2 * N)), name="conv1d")
        g.state(conv_state, name="conv_state")
        x, b, cc = g.split(xbc, "bsgc->bsgrp,bsgn,bsgn", (("b", "s", G, r, P), ("b", "s", G, N), ("b", "s", G, N)),
                           name="conv_split")
        yy, ssm_state = g.ssd_scan(x, dt, g.param("A_log", (G, r), dtype="fp32"), b, cc,
                                   g.param("D", (G, r), dtype="fp32"), g.param("dt_bias", (G, r)), chunk=c.chunk_size,
                                   name="ssd")
        g.state(ssm_state, name="ssm_state")
        yy = g.norm("gated_rmsnorm", yy, g.param("norm_gated.weight", (G, r, P)), gate=z, over=2, name="norm_gated")
        return g.einsum("bsgrp,grph->bsh", yy, g.param("out_proj.weight", (G, r, P, h)), name="out_proj")


def _mamba1(g: GraphBuilder, c: HybridConfig, y: Tensor) -> Tensor:
    """A Mamba-1 mixer (transformers' MambaMixer, mamba_ssm's Mamba): channels C = d_inner
    (dim ``mg``, what tensor parallel splits), state N, Δ rank R, conv taps K."""
    h, C, N, K, R = sym.dims("h mg mn mk mr")
    with g.scope("mamba"):
        bias = g.param("in_proj.bias", (C, 2)) if c.ssm_proj_bias else None
        xz = g.einsum("bsh,hcz->bscz", y, g.param("in_proj.weight", (h, C, 2)), bias=bias, name="in_proj")
        x, z = g.split(xz, "bscz->bsc,bsc", (("b", "s", C), ("b", "s", C)), name="in_split")
        x, conv_state = g.causal_conv1d(x, g.param("conv1d.weight", (C, K)), g.param("conv1d.bias", (C,)),
                                        name="conv1d")
        g.state(conv_state, name="conv_state")
        dbc = g.einsum("bsc,cr->bsr", x, g.param("x_proj.weight", (C, R + 2 * N)), name="x_proj")
        dt, b, cc = g.split(dbc, "bsr->bst,bsn,bsn", (("b", "s", R), ("b", "s", N), ("b", "s", N)), name="x_split")
        if c.ssm_dt_norm:  # Jamba: RMSNorms of Δ, B and C
            dt, b, cc = (blocks.norm(g, t, name) for t, name in ((dt, "dt_norm"), (b, "b_norm"), (cc, "c_norm")))
        dt = g.einsum("bst,tc->bsc", dt, g.param("dt_proj.weight", (R, C)), bias=g.param("dt_proj.bias", (C,)),
                      name="dt_proj")
        yy, state = g.kernel("selective_scan", x, dt, g.param("A_log", (C, N), dtype="fp32"), b, cc,
                             g.param("D", (C,), dtype="fp32"), z, name="scan")
        g.state(state, name="ssm_state")
        out = g.einsum("bsc,ch->bsh", yy, g.param("out_proj.weight", (C, h)), name="out_proj")
        if c.ssm_proj_bias:
            out = g.elementwise("add", out, g.param("out_proj.bias", (h,)), spec="bsh,h->bsh", name="out_proj_bias")
        return out


def _attention(g: GraphBuilder, c: HybridConfig, y: Tensor) -> Tensor:
    return blocks.gqa_attention(g, y, kind=c.attention, causal_flops=c.causal_flops, rope=c.rope)


def _mlp(g: GraphBuilder, c: HybridConfig, y: Tensor, width=None, prefix: str = "mlp") -> Tensor:
    if c.mlp_act == "swiglu":
        return blocks.swiglu_mlp(g, y, width, prefix=prefix)
    h = sym.dim("h")
    width = sym.dim("f") if width is None else width
    with g.scope(prefix):
        u = g.einsum("bsh,hf->bsf", y, g.param("up.weight", (h, width)), name="up")
        u = g.elementwise("relu2", u, name="relu2")
        return g.einsum("bsf,fh->bsh", u, g.param("down.weight", (width, h)), name="down")


def _moe(g: GraphBuilder, c: HybridConfig, y: Tensor) -> Tensor:
    h, E, k, fe = sym.dims("h E k fe")
    with g.scope("moe"):
        logits = g.einsum("bsh,he->bse", y, g.param("router.weight", (h, E)), name="router_logits")
        weights = g.router(logits, k=k, score=c.router_score, name="router")
        xe = g.dispatch(y, weights, k=k, name="dispatch")
        up = g.einsum("ech,ehf->ecf", xe, g.param("experts.up.weight", (E, h, fe), tags=EXPERT), name="experts.up")
        if c.mlp_act == "swiglu":
            gate = g.einsum("ech,ehf->ecf", xe, g.param("experts.gate.weight", (E, h, fe), tags=EXPERT),
                            name="experts.gate")
            act = g.swiglu(gate, up, name="experts.swiglu")
        else:
            act = g.elementwise("relu2", up, name="experts.relu2")
        ye = g.einsum("ecf,efh->ech", act, g.param("experts.down.weight", (E, fe, h), tags=EXPERT),
                      name="experts.down")
        out = g.combine(ye, weights, k=k, name="combine")
    if c.shared_expert_ffn_hidden:
        out = g.add(out, _mlp(g, c, y, sym.dim("fs"), prefix="moe.shared"), name="moe.add_shared")
    return out


def _shared_weights(g: GraphBuilder, k: int) -> dict[str, Tensor]:
    """Shared transformer block ``k``'s weights, made once (outside every layer)."""
    h, a, kv, d, f = sym.dims("h a g d f")
    with g.scope(f"shared.{k}"):
        return {
            "input_norm": g.param("input_norm.weight", (2 * h,)),
            "qkv": g.param("qkv.weight", (2 * h, kv, a / kv + 2, d)),
            "proj": g.param("proj.weight", (kv, a / kv, d, h)),
            "ffn_norm": g.param("ffn_norm.weight", (h,)),
            "gate_up": g.param("gate_up.weight", (h, 2, f)),
            "down": g.param("down.weight", (f, h)),
        }


def _shared_block(g: GraphBuilder, c: HybridConfig, x: Tensor, embeddings: Tensor, w: dict[str, Tensor]) -> Tensor:
    """One use of a shared transformer block (transformers' Zamba2AttentionDecoderLayer and
    the hybrid layer's linear): [b,s,h] -> [b,s,h], what joins the Mamba mixer's input."""
    h, a, kv, d, f = sym.dims("h a g d f")
    r = a / kv
    with g.scope("shared"):
        joined = g.concat([x, embeddings], "bsh,bse->bsz", ("b", "s", 2 * h), name="concat")
        y = g.norm("rmsnorm", joined, w["input_norm"], name="input_norm")
        qkv = g.einsum("bsz,zgcd->bsgcd", y, w["qkv"], name="qkv")
        q, k, v = g.split(qkv, "bsgcd->bsgrd,bsgd,bsgd", (("b", "s", kv, r, d), ("b", "s", kv, d), ("b", "s", kv, d)),
                          name="split")
        if c.shared_attn_adapter:
            q, k, v = _attention_adapters(g, y, q, k, v)
        if c.rope:
            q, k = g.rope(q, name="q_rope"), g.rope(k, name="k_rope")
        k, v = g.cache(k, name="k_cache"), g.cache(v, name="v_cache")
    ctx = blocks.attention_core(g, q, k, v, kind=c.attention, causal_flops=c.causal_flops, prefix="shared.attn")
    with g.scope("shared"):
        out = g.einsum("bsgrd,grdh->bsh", ctx, w["proj"], name="proj")
        y = g.norm("rmsnorm", out, w["ffn_norm"], name="ffn_norm")
        gate_up = g.einsum("bsh,htf->bstf", y, w["gate_up"], name="gate_up")
        if c.shared_mlp_adapter:
            lr = sym.dim("lr")
            low = g.einsum("bsh,hn->bsn", y, g.param("mlp_adapter.down.weight", (h, lr)), name="mlp_adapter.down")
            up = g.einsum("bsn,ntf->bstf", low, g.param("mlp_adapter.up.weight", (lr, 2, f)), name="mlp_adapter.up")
            gate_up = g.add(gate_up, up, name="mlp_adapter.add")
        gate, up = g.split(gate_up, "bstf->bsf,bsf", (("b", "s", f), ("b", "s", f)), name="gate_up_split")
        act = g.elementwise(c.shared_act, gate, up, name=c.shared_act)
        out = g.einsum("bsf,fh->bsh", act, w["down"], name="down")
        return g.einsum("bsh,hk->bsk", out, g.param("linear.weight", (h, h)), name="linear")


def _attention_adapters(g: GraphBuilder, y: Tensor, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, ...]:
    """Per-use LoRA adapters on q, k and v (transformers' linear_{q,k,v}_adapter_list): the
    normed block input [b,s,2h] down to rank lr (the three down projections as one matmul),
    each up to its projection's width and added."""
    h, a, kv, d, lr = sym.dims("h a g d lr")
    r = a / kv
    low = g.einsum("bsz,zjn->bsjn", y, g.param("attn_adapter.down.weight", (2 * h, 3, lr)), name="attn_adapter.down")
    parts = g.split(low, "bsjn->bsn,bsn,bsn", (("b", "s", lr),) * 3, name="attn_adapter.split")
    out = []
    for name, t, part, (spec, shape) in zip("qkv", (q, k, v), parts, (("bsn,ngrd->bsgrd", (lr, kv, r, d)),
                                                                       ("bsn,ngd->bsgd", (lr, kv, d)),
                                                                       ("bsn,ngd->bsgd", (lr, kv, d)))):
        up = g.einsum(spec, part, g.param(f"attn_adapter.{name}_up.weight", shape), name=f"attn_adapter.{name}_up")
        out.append(g.add(t, up, name=f"attn_adapter.{name}_add"))
    return tuple(out)


#: each layer kind's name scope and block
LAYERS = {"mamba": ("mamba", _mamba), "attention": ("attn", _attention), "mlp": ("mlp", _mlp), "moe": ("moe", _moe)}
