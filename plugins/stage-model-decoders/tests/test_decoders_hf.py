"""Hugging Face config.json import (gemma2, gemma3, gemma3_text, phi3, olmo2) and export."""

from __future__ import annotations

import json

import pytest
from stage_core.api import UsageError, param_counts

from public_decoder_configs import GEMMA2_2B, GEMMA2_9B, GEMMA2_27B, GEMMA3_1B, GEMMA3_27B, OLMO2_7B, PHI3_MINI, PHI4
from stage_model_decoders import PRESETS, DecoderConfig, build, config_from_hf, to_hf

PUBLIC = [  # (config.json, preset, what the import's defaults differ in)
    (GEMMA2_2B, "gemma2-2b", {}),
    (GEMMA2_9B, "gemma2-9b", {}),
    (GEMMA2_27B, "gemma2-27b", {}),
    (GEMMA3_1B, "gemma3-1b", {"seq_len": 8192}),
    (GEMMA3_27B, "gemma3-27b", {"seq_len": 8192}),
    (PHI3_MINI, "phi3-mini", {}),
    (PHI4, "phi4", {"seq_len": 8192}),
    (OLMO2_7B, "olmo2-7b", {}),
]


@pytest.mark.parametrize("hf,name,changes", PUBLIC, ids=[p[1] for p in PUBLIC])
def test_public_configs_give_the_presets(hf, name, changes):
    c = config_from_hf(hf)
    assert c == PRESETS[name].replace(name=c.name, **changes)
    assert param_counts(build(c)) == param_counts(build(PRESETS[name]))


def test_gemma_local_and_global_layers():
    assert config_from_hf(GEMMA2_2B).local_layers == tuple(range(0, 26, 2))  # layer 0 local, 1 global, ...
    assert [i for i in range(26) if not config_from_hf(GEMMA3_1B).is_local(i)] == [5, 11, 17, 23]
    assert config_from_hf(PHI3_MINI).local_layers == tuple(range(32))  # Phi-3: every layer, Mistral-style
    assert config_from_hf(PHI4).local_layers == ()


def test_layer_types_when_given():
    types = ["sliding_attention", "full_attention"] * 13
    assert config_from_hf({**GEMMA2_2B, "layer_types": types}).global_every == 2
    every_third = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(26)]
    assert config_from_hf({**GEMMA3_1B, "layer_types": every_third}).global_every == 3
    full = config_from_hf({**GEMMA2_2B, "layer_types": ["full_attention"] * 26})
    assert full.sliding_window is None and full.local_layers == ()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_round_trip_every_preset(name):
    c = PRESETS[name]
    back = config_from_hf(json.loads(json.dumps(to_hf(c))))
    assert back == c


@pytest.mark.parametrize(
    "base,change,key",
    [
        (GEMMA2_2B, {"num_attention_heads": 7, "head_dim": None}, "num_attention_heads"),
        (GEMMA2_2B, {"num_key_value_heads": 3}, "num_key_value_heads"),
        (GEMMA2_2B, {"hidden_activation": "relu"}, "hidden_activation"),
        (GEMMA2_2B, {"attention_bias": True}, "attention_bias"),
        (GEMMA2_2B, {"sliding_window": 0}, "sliding_window"),
        (GEMMA2_2B, {"attn_logit_softcapping": -1}, "attn_logit_softcapping"),
        (GEMMA2_2B, {"layer_types": ["full_attention"] * 3}, "layer_types"),
        (GEMMA2_2B, {"layer_types": ["sliding_attention"] + ["full_attention"] * 2 + ["sliding_attention"] * 23},
         "layer_types"),  # not periodic
        (GEMMA2_2B, {"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        (GEMMA3_1B, {"sliding_window_pattern": 0}, "sliding_window_pattern"),
        ({**GEMMA3_27B, "text_config": None}, {}, "text_config"),
        (PHI3_MINI, {"hidden_act": "gelu"}, "hidden_act"),
        (PHI3_MINI, {"intermediate_size": None}, "intermediate_size"),
        (OLMO2_7B, {"sliding_window": 4096}, "sliding_window"),
        (OLMO2_7B, {"stage": {"seq_len": 16384}}, "seq_len"),
        (OLMO2_7B, {"stage": {"heads": 4}}, "stage.heads"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(base, change, key):
    with pytest.raises(UsageError) as info:
        config_from_hf({**base, **change})
    message = str(info.value)
    assert "\n" not in message and key in message


def test_nested_text_config_errors_name_it():
    with pytest.raises(UsageError, match="text_config.*'hidden_size'"):
        config_from_hf({**GEMMA3_27B, "text_config": {k: v for k, v in GEMMA3_27B["text_config"].items()
                                                     if k != "hidden_size"}})


def test_other_model_types_are_not_ours():
    assert config_from_hf({"model_type": "llama"}) is None
    assert config_from_hf({"hidden_size": 4096}) is None


def test_export_refuses_what_the_family_cannot_say():
    with pytest.raises(UsageError, match="norm_placement"):
        to_hf(PRESETS["phi4"].replace(norm_placement="post"))
    with pytest.raises(UsageError, match="attn_softcap"):
        to_hf(PRESETS["olmo2-7b"].replace(attn_softcap=50.0))
    assert PRESETS["gemma3-1b"].to_hf()["model_type"] == "gemma3_text"
    assert isinstance(config_from_hf(to_hf(PRESETS["gemma2-9b"])), DecoderConfig)


def test_config_file_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(OLMO2_7B))
    assert config_from_hf(tmp_path).qk_norm == "all"
