"""The plugin's hooks, the config's validation and the graph's layout conventions."""

from __future__ import annotations

import time
from importlib.metadata import entry_points

import pytest
from stage_core.api import PLAN_DIMS, UsageError, sym
from stage_core.records import ModelSpec
from stage_core.testing import fresh_host

from stage_model_llama import PRESETS, LlamaConfig, build, plugin
from stage_model_llama.hf import to_hf

EXPECTED = {"llama-tiny", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b",
            "mistral-7b", "qwen2.5-7b", "qwen2.5-72b"}


def _manager():
    return fresh_host((plugin, "llama")).pm


def test_stage_models_hook():
    (specs,) = _manager().hook.stage_models()
    (spec,) = specs
    assert isinstance(spec, ModelSpec)
    assert (spec.name, spec.family) == ("llama", "llama")
    assert {"llama", "mistral", "qwen2", "qwen3", "falcon"} <= set(spec.hf_model_types)
    assert spec.build is build
    assert set(spec.presets) == EXPECTED
    for name, c in spec.presets.items():
        assert c.name == name and c.family == "llama" and c.dtype == "bf16" and c.seq_len > 0
        assert spec.from_dict(c.to_dict()) == c


def test_the_family_reads_config_json_by_its_keys():
    (specs,) = _manager().hook.stage_models()
    reader = specs[0].hf_reader
    assert reader.generic and reader.can_read(to_hf(PRESETS["llama2-70b"]))
    assert not reader.can_read({"model_type": "llama", "n_embd": 768})
    host = fresh_host((plugin, "llama"))
    assert host.config_from_hf(to_hf(PRESETS["llama2-70b"])) == PRESETS["llama2-70b"]
    # the keys decide; the model_type is only a hint
    assert host.config_from_hf({**to_hf(PRESETS["llama2-70b"]), "model_type": "unheard-of"}) == PRESETS["llama2-70b"]


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in entry_points(group="stage")}
    assert names.get("llama") == "stage_model_llama.plugin"


def test_public_shapes():
    # REFERENCE §4 (public configs): L, h, f, a, g, V
    table = {
        "llama2-7b": (32, 4096, 11008, 32, 32, 32000),
        "llama2-70b": (80, 8192, 28672, 64, 8, 32000),
        "llama3-8b": (32, 4096, 14336, 32, 8, 128256),
        "llama3-70b": (80, 8192, 28672, 64, 8, 128256),
        "llama3-405b": (126, 16384, 53248, 128, 8, 128256),
        "qwen2.5-72b": (80, 8192, 29568, 64, 8, 152064),
    }
    for name, row in table.items():
        c = PRESETS[name]
        assert (c.layers, c.hidden, c.ffn_hidden, c.heads, c.groups, c.padded_vocab) == row, name
    assert PRESETS["qwen2.5-7b"].qkv_bias and PRESETS["qwen2.5-72b"].qkv_bias
    assert not any(c.qkv_bias for n, c in PRESETS.items() if not n.startswith("qwen"))
    assert not any(c.tie_embeddings for c in PRESETS.values())


@pytest.mark.parametrize(
    "change,field",
    [
        ({"heads": 3}, "heads"),  # 3 does not divide 128
        ({"kv_heads": 3}, "kv_heads"),  # 3 does not divide 4
        ({"kv_heads": 0}, "kv_heads"),
        ({"head_dim": -1}, "head_dim"),
        ({"layers": 0}, "layers"),
        ({"ffn_hidden": 0}, "ffn_hidden"),
        ({"vocab_size": -5}, "vocab_size"),
        ({"hidden": 128.0}, "hidden"),
        ({"seq_len": 1024}, "seq_len"),  # beyond max_positions 256
        ({"attention": "paged"}, "attention"),
        ({"dtype": "fp64"}, "dtype"),
        ({"qkv_bias": 1}, "qkv_bias"),
        ({"family": "gpt"}, "family"),
    ],
)
def test_invalid_configs_name_the_field(change, field):
    with pytest.raises(UsageError, match=field):
        PRESETS["llama-tiny"].replace(**change)


def test_head_dim_frees_heads_from_dividing_hidden():
    c = PRESETS["llama-tiny"].replace(heads=6, kv_heads=2, head_dim=32)
    assert build(c).dims["d"] == 32


def test_overrides_and_dict_round_trip():
    c = PRESETS["llama-tiny"].with_overrides({"kv_heads": "none", "attention": "classic", "qkv_bias": "true"})
    assert c.kv_heads is None and c.groups == c.heads and c.qkv_bias
    assert LlamaConfig.from_dict(c.to_dict()) == c
    with pytest.raises(UsageError, match="kv_heads"):
        PRESETS["llama-tiny"].with_overrides({"kv_heads": "3"})


def test_dims_and_meta():
    g = build(PRESETS["llama3-405b"])
    assert g.dims == {"h": 16384, "a": 128, "g": 8, "d": 128, "f": 53248, "V": 128256}
    assert not set(PLAN_DIMS) & set(g.dims)
    assert g.meta["layers"] == 126 and g.meta["seq_len"] == 8192
    used = set()
    for op in g.ops:
        for t in op.inputs + op.outputs:
            for size in t.shape:
                used |= sym.names_in(size)
    assert used == set(g.dims) | set(PLAN_DIMS)


def test_layer_layout_and_names():
    c = PRESETS["llama-tiny"].replace(attention="classic", qkv_bias=True)
    g = build(c)
    by_name = {op.name: op for op in g.ops}
    for i in range(c.layers):
        for part in ("attn.norm", "attn.qkv", "attn.split", "attn.rope_q", "attn.rope_k", "attn.scores",
                     "attn.softmax", "attn.context", "attn.proj", "attn.residual", "mlp.norm", "mlp.gate",
                     "mlp.up", "mlp.swiglu", "mlp.down", "mlp.residual"):
            op = by_name[f"layers.{i}.{part}"]
            assert op.layer == i
    assert [op.name for op in g.ops if op.layer is None] == ["embed", "final_norm", "head", "loss"]
    assert {op.name for op in g.ops if op.block == "attn_core"} == {
        f"layers.{i}.attn.{p}" for i in range(c.layers) for p in ("scores", "softmax", "context")}
    assert not any(op.fn and "dropout" in op.fn for op in g.ops)
    qkv = by_name["layers.0.attn.qkv"]
    assert qkv.attrs["einsum"] == "bsh,hgcd->bsgcd" and qkv.attrs["has_bias"]
    assert by_name["layers.0.attn.proj"].attrs["einsum"] == "bsgrd,grdh->bsh"
    assert not by_name["layers.0.attn.proj"].attrs["has_bias"]
    assert by_name["layers.0.attn.residual"].fn == "add"
    assert by_name["layers.0.mlp.swiglu"].fn == "swiglu"
    assert by_name["layers.0.attn.norm"].fn == "rmsnorm" and len(by_name["layers.0.attn.norm"].inputs) == 2
    assert by_name["head"].inputs[1].name == "head.weight"
    tied = build(c.replace(tie_embeddings=True))
    assert next(op for op in tied.ops if op.name == "head").inputs[1].name == "embed.wte"


def test_attention_shapes_with_gqa():
    g = build(PRESETS["llama3-8b"])
    split = next(op for op in g.ops if op.name == "layers.0.attn.split")
    q, k, v = split.outputs
    b, s, kv, a, d, h = sym.dims("b s g a d h")
    assert q.shape == (b, s, kv, a / kv, d)
    assert k.shape == v.shape == (b, s, kv, d)
    params = {p.name: p for p in g.params}
    assert params["layers.0.attn.qkv.weight"].shape == (h, kv, a / kv + 2, d)
    assert params["layers.0.attn.proj.weight"].shape == (kv, a / kv, d, h)
    rope = [op for op in g.ops if op.name.startswith("layers.0.attn.rope")]
    assert [op.inputs[0] for op in rope] == [q, k]
    flash = next(op for op in g.ops if op.name == "layers.0.attn.flash")
    assert flash.block == "attn_core" and flash.inputs == (rope[0].outputs[0], rope[1].outputs[0], v)


def test_residual_stream_is_tagged():
    c = PRESETS["llama-tiny"]
    g = build(c)
    tagged = [op.name for op in g.ops if any("residual" in t.tags for t in op.outputs)]
    assert tagged == ["embed"] + [f"layers.{i}.{p}.residual" for i in range(c.layers) for p in ("attn", "mlp")]


def test_405b_builds_fast():
    t0 = time.perf_counter()
    g = build(PRESETS["llama3-405b"])
    assert time.perf_counter() - t0 < 1.0
    assert sum(op.layer is not None for op in g.ops) == 126 * 14  # 14 ops per layer with flash
