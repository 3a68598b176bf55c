"""Hugging Face config.json import (mamba2, nemotron_h) and export."""

from __future__ import annotations

import json

import pytest
from stage_core.api import UsageError, param_counts

from public_ssm_configs import MAMBA2_2_7B, NEMOTRON_H_8B
from stage_model_ssm import PRESETS, HybridConfig, build, config_from_hf, to_hf


def test_nemotron_h_8b_gives_the_preset():
    c = config_from_hf(NEMOTRON_H_8B)
    assert c == PRESETS["nemotron-h-8b"].replace(name=c.name)
    assert c.layer_indices("attention") == (7, 18, 29, 40)


def test_mamba2_2_7b_gives_the_preset_model():
    c = config_from_hf(MAMBA2_2_7B)
    # the transformers-format config stores the padded vocabulary
    assert c == PRESETS["mamba2-2.7b"].replace(name=c.name, vocab_size=50288, vocab_pad_to=1)
    assert param_counts(build(c)) == param_counts(build(PRESETS["mamba2-2.7b"]))


def test_layers_block_type_and_moe_layers():
    blocks = ["mamba", "moe", "mamba", "attention", "moe", "mamba", "moe"]
    hf = {**NEMOTRON_H_8B, "hybrid_override_pattern": None, "layers_block_type": blocks, "num_hidden_layers": 7,
          "n_routed_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
          "moe_shared_expert_intermediate_size": 8192}
    c = config_from_hf(hf)
    assert c.pattern == "MEM*EME"
    assert (c.experts, c.experts_per_token, c.expert_ffn_hidden, c.shared_expert_ffn_hidden) == (64, 8, 2048, 8192)
    assert c.router_score == "sigmoid"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_round_trip_every_preset(name):
    c = PRESETS[name]
    assert config_from_hf(json.loads(json.dumps(to_hf(c)))) == c


@pytest.mark.parametrize("base,change,key", [
    (NEMOTRON_H_8B, {"hybrid_override_pattern": "M-X"}, "hybrid_override_pattern"),
    (NEMOTRON_H_8B, {"num_hidden_layers": 50}, "hybrid_override_pattern"),
    (NEMOTRON_H_8B, {"hybrid_override_pattern": None}, "layers_block_type"),
    (NEMOTRON_H_8B, {"n_groups": 3}, "n_groups"),  # does not divide the 128 heads
    (NEMOTRON_H_8B, {"mamba_num_heads": 0}, "mamba_num_heads"),
    (NEMOTRON_H_8B, {"num_key_value_heads": 5}, "num_key_value_heads"),
    (NEMOTRON_H_8B, {"mlp_hidden_act": "silu"}, "mlp_hidden_act"),
    (NEMOTRON_H_8B, {"use_bias": True}, "use_bias"),
    (NEMOTRON_H_8B, {"use_conv_bias": False}, "use_conv_bias"),
    (NEMOTRON_H_8B, {"moe_latent_size": 1024}, "moe_latent_size"),
    (NEMOTRON_H_8B, {"ssm_state_size": None}, "ssm_state_size"),
    (NEMOTRON_H_8B, {"stage": {"seq_len": 16384}}, "seq_len"),
    (MAMBA2_2_7B, {"num_heads": 64}, "num_heads"),  # 64·64 is not expand·hidden
    (MAMBA2_2_7B, {"rms_norm": False}, "rms_norm"),
    (MAMBA2_2_7B, {"hidden_act": "gelu"}, "hidden_act"),
    (MAMBA2_2_7B, {"state_size": -1}, "state_size"),
])
def test_bad_values_are_one_line_naming_the_key(base, change, key):
    with pytest.raises(UsageError) as info:
        config_from_hf({**base, **change})
    assert "\n" not in str(info.value) and key in str(info.value)


def test_other_model_types_are_not_ours():
    assert config_from_hf({"model_type": "llama"}) is None
    assert config_from_hf({"model_type": "gemma2"}) is None


def test_export_is_plain_json():
    c = PRESETS["nemotron-h-8b"]
    assert json.loads(json.dumps(to_hf(c))) == to_hf(c)
    assert isinstance(config_from_hf(c.to_hf()), HybridConfig)
