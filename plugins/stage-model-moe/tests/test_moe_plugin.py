"""The plugin's hooks, the config's validation and the graph's layout conventions."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import sympy as sp
from stage_core.api import PLAN_DIMS, UsageError, differentiate, sym
from stage_core.records import ModelSpec
from stage_core.testing import fresh_host

from stage_model_moe import PRESETS, MoEConfig, build, plugin, to_hf


def _manager():
    return fresh_host((plugin, "moe")).pm


def by_name(graph):
    return {op.name: op for op in graph.ops}


def param(graph, name):
    return next(p for p in graph.params if p.name == name)


# ---------------------------------------------------------------------- hooks
def test_stage_models_hook():
    (specs,) = _manager().hook.stage_models()
    (spec,) = specs
    assert isinstance(spec, ModelSpec)
    assert (spec.name, spec.family) == ("moe", "moe")
    assert {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe", "phimoe", "gpt_oss",
            "llama4"} <= set(spec.hf_model_types)
    assert spec.build is build
    assert set(spec.presets) == {"mixtral-8x7b", "mixtral-8x22b", "qwen3-235b-a22b", "deepseek-v3", "moe-tiny",
                                 "moe-mla-tiny"}
    for name, c in spec.presets.items():
        assert c.name == name and c.family == "moe" and c.dtype == "bf16" and c.seq_len > 0
        assert spec.from_dict(c.to_dict()) == c


def test_the_family_reads_config_json_by_its_keys():
    host = fresh_host((plugin, "moe"))
    assert host.config_from_hf(to_hf(PRESETS["deepseek-v3"])) == PRESETS["deepseek-v3"]
    # any model_type with experts' keys reads; an unknown one mirrors no export type
    renamed = host.config_from_hf({**to_hf(PRESETS["mixtral-8x7b"]), "model_type": "new-moe"})
    assert renamed.replace(arch="mixtral") == PRESETS["mixtral-8x7b"]
    with pytest.raises(UsageError, match="needs num_local_experts or num_experts or n_routed_experts"):
        host.config_from_hf({"model_type": "gpt2", "hidden_size": 8, "num_hidden_layers": 2,
                             "num_attention_heads": 2, "vocab_size": 8})


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in entry_points(group="stage")}
    assert names.get("moe") == "stage_model_moe.plugin"


# ---------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "change,field",
    [
        ({"experts_per_token": 5}, "experts_per_token"),  # top-5 of 4 experts
        ({"kv_heads": 3}, "kv_heads"),  # 3 does not divide 4 heads
        ({"heads": 3, "kv_heads": 1}, "heads"),  # 3 does not divide hidden 128 (head_dim derived)
        ({"layers": 0}, "layers"),
        ({"hidden": -128}, "hidden"),
        ({"experts": 0}, "experts"),
        ({"expert_ffn_hidden": 0}, "expert_ffn_hidden"),
        ({"shared_expert_ffn_hidden": -1}, "shared_expert_ffn_hidden"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"head_dim": 0}, "head_dim"),
        ({"capacity_factor": 0.0}, "capacity_factor"),
        ({"capacity_factor": "big"}, "capacity_factor"),
        ({"routed_scaling_factor": -1.0}, "routed_scaling_factor"),
        ({"sparse_step": 0}, "sparse_step"),
        ({"first_dense_layers": 3}, "first_dense_layers"),  # more than the 2 layers
        ({"dense_layers": "2"}, "dense_layers"),  # layer 2 of 0..1
        ({"dense_layers": "one"}, "dense_layers"),
        ({"router_score": "relu"}, "router_score"),
        ({"attention": "sparse"}, "attention"),
        ({"attention_type": "mqa"}, "attention_type"),
        ({"arch": "gpt2"}, "arch"),
        ({"dtype": "int8"}, "dtype"),
        ({"family": "llama"}, "family"),
        ({"layers": 2.0}, "layers"),
        ({"qk_norm": "yes"}, "qk_norm"),
        ({"topk_groups": 2}, "topk_groups"),  # more than expert_groups 1
        ({"expert_groups": 3, "topk_groups": 1}, "expert_groups"),  # 3 does not divide 4 experts
        ({"shared_expert_gate": True}, "shared_expert_gate"),  # no shared experts
        ({"attention_type": "mla"}, "kv_lora_rank"),
    ],
)
def test_invalid_configs_name_the_field(change, field):
    with pytest.raises(UsageError, match=field):
        PRESETS["moe-tiny"].replace(**change)


def test_invalid_mla_configs():
    base = PRESETS["moe-mla-tiny"]
    for change, field in [({"v_head_dim": 0}, "v_head_dim"), ({"q_lora_rank": 0}, "q_lora_rank"),
                          ({"kv_heads": 2}, "kv_heads"), ({"qk_norm": True}, "qk_norm"),
                          ({"shared_expert_ffn_hidden": 96}, "shared_expert_ffn_hidden")]:
        with pytest.raises(UsageError, match=field):
            base.replace(**change)


def test_overrides_and_dict_round_trip():
    c = PRESETS["moe-tiny"].with_overrides({"experts": "8", "capacity_factor": "1.25", "attention": "classic"})
    assert (c.experts, c.capacity_factor, c.attention) == (8, 1.25, "classic")
    assert MoEConfig.from_dict(c.to_dict()) == c
    assert c.with_overrides({"capacity_factor": "none"}).capacity_factor is None
    with pytest.raises(UsageError, match="experts_per_token"):
        PRESETS["moe-tiny"].with_overrides({"experts_per_token": "9"})


# ---------------------------------------------------------------------- graph layout
def test_dims_and_meta():
    g = build(PRESETS["mixtral-8x7b"])
    assert g.dims == {"h": 4096, "a": 32, "g": 8, "d": 128, "V": 32000, "E": 8, "k": 2, "fe": 14336}
    assert g.meta["experts"] == 8 and g.meta["experts_per_token"] == 2
    assert g.meta["layers"] == 32 and g.meta["seq_len"] == 4096
    assert g.meta["kv_cache_elements_per_token_per_layer"] == 2 * 8 * 128
    d = build(PRESETS["deepseek-v3"])
    assert d.dims == {"h": 7168, "a": 128, "V": 129280, "E": 256, "k": 8, "fe": 2048, "f": 18432, "fs": 2048,
                      "rkv": 512, "dn": 128, "dr": 64, "dv": 128, "rq": 1536}
    # REFERENCE.md §4: DeepSeek-V3 caches 576 elements per token per layer (kv_lora_rank + qk_rope)
    assert d.meta["kv_cache_elements_per_token_per_layer"] == 576
    assert d.meta["moe_layers"] == list(range(3, 61)) and d.meta["dense_layers"] == [0, 1, 2]
    assert d.meta["mtp_layers_not_built"] == 1
    for graph in (g, d, build(PRESETS["qwen3-235b-a22b"])):
        assert not set(PLAN_DIMS) & set(graph.dims)
        used = set()
        for op in graph.ops:
            for t in op.inputs + op.outputs:
                for size in t.shape:
                    used |= sym.names_in(size)
        assert used == set(graph.dims) | set(PLAN_DIMS)


def test_gqa_moe_layer_layout():
    c = PRESETS["qwen3-235b-a22b"]
    g = build(c)
    ops = by_name(g)
    for part in ("attn.norm", "attn.qkv", "attn.split", "attn.q_norm", "attn.k_norm", "attn.q_rope", "attn.k_rope",
                 "attn.flash", "attn.proj", "attn.residual", "mlp.norm", "moe.router_logits", "moe.router",
                 "moe.dispatch", "moe.experts.gate", "moe.experts.up", "moe.experts.swiglu", "moe.experts.down",
                 "moe.combine", "mlp.residual"):
        assert f"layers.0.{part}" in ops, part
    assert [op.name for op in g.ops if op.layer is None] == ["embed", "final_norm", "head", "loss"]
    assert ops["layers.0.attn.qkv"].attrs["einsum"] == "bsh,hgcd->bsgcd"
    assert ops["layers.0.attn.proj"].attrs["einsum"] == "bsgrd,grdh->bsh"
    assert ops["layers.0.moe.router_logits"].attrs["einsum"] == "bsh,he->bse"
    assert ops["layers.0.moe.experts.gate"].attrs["einsum"] == "ech,ehf->ecf"
    assert ops["layers.0.moe.experts.down"].attrs["einsum"] == "ecf,efh->ech"
    assert ops["head"].attrs["einsum"] == "bsh,vh->bsv"
    assert {op.name for op in g.ops if op.block == "attn_core"} == {f"layers.{i}.attn.flash" for i in range(94)}
    b, s, h, a, kv, d, E, k, fe = sym.dims("b s h a g d E k fe")
    q, kk, v = ops["layers.0.attn.split"].outputs
    assert q.shape == (b, s, kv, a / kv, d) and kk.shape == v.shape == (b, s, kv, d)
    assert param(g, "layers.0.attn.qkv.weight").shape == (h, kv, a / kv + 2, d)
    assert param(g, "layers.0.attn.proj.weight").shape == (kv, a / kv, d, h)
    assert param(g, "layers.0.moe.router.weight").shape == (h, E)
    assert "expert" not in param(g, "layers.0.moe.router.weight").tags
    for w, shape in (("gate", (E, h, fe)), ("up", (E, h, fe)), ("down", (E, fe, h))):
        p = param(g, f"layers.0.moe.experts.{w}.weight")
        assert p.shape == shape and "expert" in p.tags
    dispatch, combine = ops["layers.0.moe.dispatch"], ops["layers.0.moe.combine"]
    assert dispatch.outputs[0].shape == (E, b * s * k / E, h)
    for op in (dispatch, combine):
        assert (op.attrs["token_letters"], op.attrs["slot_letter"], op.attrs["expert_letter"]) == ("bs", "c", "e")
        assert op.attrs["experts_per_token"] == 8
    router = ops["layers.0.moe.router"]
    assert router.attrs["score"] == "softmax" and router.attrs["normalize"]
    assert router.outputs[0].shape == (b, s, E)


def test_mla_layer_layout():
    c = PRESETS["deepseek-v3"]
    g = build(c)
    ops = by_name(g)
    h, a, rq, rkv, dn, dr, dv, f, fs = sym.dims("h a rq rkv dn dr dv f fs")
    assert param(g, "layers.0.attn.q_a.weight").shape == (h, rq)
    assert param(g, "layers.0.attn.q_b.weight").shape == (rq, a, dn + dr)
    assert param(g, "layers.0.attn.kv_a.weight").shape == (h, rkv + dr)
    assert param(g, "layers.0.attn.kv_b.weight").shape == (rkv, a, dn + dv)
    assert param(g, "layers.0.attn.proj.weight").shape == (a, dv, h)
    flash = ops["layers.0.attn.flash"]
    q, k, v = flash.inputs
    b, s = sym.dims("b s")
    assert q.shape == (b, s, a, 1, dn + dr) and k.shape == (b, s, a, dn + dr) and v.shape == (b, s, a, dv)
    assert flash.outputs[0].shape == (b, s, a, 1, dv) and flash.attrs["separate_value_dim"]
    assert ops["layers.0.attn.k_join"].fn == "concat"
    # dense first layers, MoE with one shared expert after
    assert param(g, "layers.2.mlp.gate.weight").shape == (h, f)
    assert "layers.2.moe.router" not in ops and "layers.3.moe.router" in ops
    assert param(g, "layers.3.moe.shared.gate.weight").shape == (h, fs)
    assert "expert" not in param(g, "layers.3.moe.shared.gate.weight").tags
    router = ops["layers.3.moe.router"]
    assert router.attrs["score"] == "sigmoid" and router.attrs["selection_bias"]
    assert router.attrs["scale"] == sp.Rational(5, 2)


def test_residual_stream_is_tagged():
    c = PRESETS["moe-tiny"]
    g = build(c)
    tagged = [op.name for op in g.ops if any("residual" in t.tags for t in op.outputs)]
    assert tagged == ["embed"] + [f"layers.{i}.{p}.residual" for i in range(c.layers) for p in ("attn", "mlp")]


def test_tied_and_untied_head():
    assert by_name(build(PRESETS["moe-tiny"]))["head"].inputs[1].name == "head.weight"
    tied = build(PRESETS["moe-tiny"].replace(tie_embeddings=True))
    assert by_name(tied)["head"].inputs[1].name == "embed.wte"


def test_qwen2_style_shared_gate_and_bias_differentiate():
    c = PRESETS["moe-tiny"].replace(arch="qwen2_moe", shared_expert_ffn_hidden=128, shared_expert_gate=True,
                                    qkv_bias=True, norm_topk_prob=False, dense_layers="1")
    g = build(c)
    ops = by_name(g)
    assert ops["layers.0.moe.shared_gate"].attrs["einsum"] == "bsh,h->bs"
    assert ops["layers.0.moe.shared_gate_sigmoid"].fn == "sigmoid"
    assert ops["layers.0.attn.qkv"].attrs["has_bias"]
    assert "layers.1.mlp.gate" in ops and "layers.1.moe.router" not in ops
    tg = differentiate(g)
    assert set(tg.grads) == set(g.params)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_differentiates(name):
    g = build(PRESETS[name])
    tg = differentiate(g)
    assert set(tg.grads) == set(g.params)
    fns = {op.fn for op in tg.backward_ops}
    assert {"moe_router_bwd", "moe_dispatch_bwd", "moe_combine_bwd"} <= fns


@pytest.mark.parametrize("attention", ["flash", "classic"])
def test_mla_classic_and_flash_agree_on_matmuls(attention):
    # both attention kernels count q·k over dn+dr and p·v over dv in forward
    c = PRESETS["moe-mla-tiny"].replace(attention=attention)
    g = build(c)
    core = [op for op in g.ops if op.block == "attn_core" and op.layer == 0]
    mm = sum(sym.evaluate(op.matmul_flops, {**g.dims, "b": 1, "s": 256}) for op in core)
    assert mm == 2 * 256 * 256 * c.heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)


def test_largest_preset_builds_whole():
    # its build time is a benchmark figure (benchmarks/bench_generate.py), not a timed test
    g = build(PRESETS["deepseek-v3"])
    assert g.meta["layers"] == 61
