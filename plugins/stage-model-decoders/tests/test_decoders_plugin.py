"""The plugin's hooks, the config's validation and each family's layer layout."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from stage_core.api import UsageError, sym
from stage_core.records import ModelSpec
from stage_core.testing import fresh_host

from stage_model_decoders import PRESETS, DecoderConfig, build, plugin
from stage_model_decoders.hf import to_hf


def _specs():
    (specs,) = fresh_host((plugin, "decoders")).pm.hook.stage_models()
    return {s.family: s for s in specs}


def test_one_family_per_model_type():
    specs = _specs()
    assert set(specs) == {"gemma2", "gemma3", "phi3", "olmo2"}
    assert specs["gemma3"].hf_model_types == ("gemma3", "gemma3_text")
    assert specs["phi3"].hf_model_types == ("phi3",)
    assert set(specs["phi3"].presets) == {"phi3-mini", "phi3-medium", "phi4"}
    assert set(specs["gemma2"].presets) == {"gemma-tiny", "gemma2-2b", "gemma2-9b", "gemma2-27b"}
    for spec in specs.values():
        assert isinstance(spec, ModelSpec) and spec.build is build
        for name, c in spec.presets.items():
            assert c.name == name and c.family == spec.family
            assert spec.from_dict(c.to_dict()) == c


def test_each_family_reads_config_json_by_its_keys():
    host = fresh_host((plugin, "decoders"))
    assert host.config_from_hf(to_hf(PRESETS["olmo2-13b"])) == PRESETS["olmo2-13b"]
    # Gemma 2's soft-capping keys name it whatever the model_type says
    assert host.config_from_hf({**to_hf(PRESETS["gemma2-9b"]), "model_type": "renamed"}).family == "gemma2"
    assert host.config_from_hf(to_hf(PRESETS["olmo2-13b"]), family="phi3").norm_placement == "pre"


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in entry_points(group="stage")}
    assert names.get("decoders") == "stage_model_decoders.plugin"


def ops_of_layer(c, i=0):
    return [op.name.removeprefix(f"layers.{i}.") for op in build(c).ops if op.layer == i]


def test_gemma_layer_is_a_sandwich():
    assert ops_of_layer(PRESETS["gemma2-2b"]) == [
        "attn.norm", "attn.qkv", "attn.split", "attn.q_rope", "attn.k_rope", "attn.flash", "attn.proj",
        "attn.post_norm", "attn.residual", "mlp.norm", "mlp.gate", "mlp.up", "mlp.geglu", "mlp.down",
        "mlp.post_norm", "mlp.residual"]
    g = build(PRESETS["gemma2-2b"])
    assert [op.name for op in g.ops if op.layer is None] == ["embed", "embed.scale", "final_norm", "head",
                                                             "softcap", "loss"]
    assert g.meta["local_layers"] == list(range(0, 26, 2)) and g.meta["sliding_window"] == 4096
    flash = {op.layer: op for op in g.ops if op.fn == "flash_attention"}
    assert flash[0].attrs["window"] == 4096 and "window" not in flash[1].attrs
    assert flash[0].attrs["softcap"] == 50


def test_gemma3_has_per_head_qk_norms():
    assert ops_of_layer(PRESETS["gemma3-1b"])[:5] == ["attn.norm", "attn.qkv", "attn.split", "attn.q_norm",
                                                     "attn.k_norm"]


def test_olmo2_normalizes_after_each_block_and_over_all_heads():
    names = ops_of_layer(PRESETS["olmo2-7b"])
    assert names[:3] == ["attn.qkv", "attn.split", "attn.q_norm"]
    assert "attn.norm" not in names and "mlp.norm" not in names
    assert names[-2:] == ["mlp.post_norm", "mlp.residual"]
    g = build(PRESETS["olmo2-7b"])
    params = {p.name: sym.evaluate(p.numel, g.dims) for p in g.params}
    assert params["layers.0.attn.q_norm.weight"] == 32 * 128  # all of q
    assert params["layers.0.attn.k_norm.weight"] == 32 * 128  # all of k (32 KV heads)


def test_phi3_is_pre_norm_with_every_layer_local():
    names = ops_of_layer(PRESETS["phi3-mini"])
    assert names[0] == "attn.norm" and "attn.post_norm" not in names and "mlp.swiglu" in names
    assert build(PRESETS["phi3-mini"]).meta["local_layers"] == list(range(32))


@pytest.mark.parametrize("change,field", [
    ({"family": "gemma4"}, "family"),
    ({"norm_placement": "middle"}, "norm_placement"),
    ({"qk_norm": "some"}, "qk_norm"),
    ({"mlp_act": "reglu"}, "mlp_act"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"global_every": -1}, "global_every"),
    ({"attn_softcap": 0.0}, "attn_softcap"),
    ({"kv_heads": 3}, "kv_heads"),
    ({"heads": 3, "head_dim": None}, "heads"),
    ({"seq_len": 1024}, "seq_len"),
])
def test_invalid_configs_name_the_field(change, field):
    with pytest.raises(UsageError, match=field):
        PRESETS["gemma-tiny"].replace(**change)


def test_overrides():
    c = PRESETS["gemma-tiny"].with_overrides({"sliding_window": "none", "final_softcap": "none"})
    assert c.local_layers == () and c.final_softcap is None
    assert DecoderConfig.from_dict(c.to_dict()) == c
