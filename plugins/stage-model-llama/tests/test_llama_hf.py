"""Hugging Face config.json import (llama, mistral, qwen2) and export."""

from __future__ import annotations

import json

import pytest
from stage_core.api import HFKeys, UsageError, param_counts

from stage_model_llama import PRESETS, LlamaConfig, build, config_from_hf, to_hf
from stage_model_llama.hf import read

#: the model-shape keys of meta-llama/Meta-Llama-3-8B's published config.json
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}

#: Qwen/Qwen2.5-7B's config.json (model-shape keys)
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "vocab_size": 152064,
}

#: mistralai/Mistral-7B-v0.1's config.json (model-shape keys)
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_round_trip_every_preset(name):
    c = PRESETS[name]
    back = config_from_hf(to_hf(c))
    assert back == c
    g0, g1 = build(c), build(back)
    assert param_counts(g0) == param_counts(g1)
    assert g0.dims == g1.dims


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_same_model_through_plain_hf_keys(name):
    c = PRESETS[name]
    hf = to_hf(c)
    del hf["stage"]
    back = config_from_hf(hf)
    assert param_counts(build(back)) == param_counts(build(c))
    assert build(back).dims == build(c).dims


def test_public_configs_give_the_presets():
    # a checkpoint's vocabulary as stored (these are multiples of 128: the presets' padding changes nothing)
    assert config_from_hf(LLAMA3_8B) == PRESETS["llama3-8b"].replace(name="hf-llama", vocab_pad_to=1)
    assert config_from_hf(QWEN25_7B) == PRESETS["qwen2.5-7b"].replace(name="hf-qwen2", seq_len=8192, vocab_pad_to=1)
    assert config_from_hf(MISTRAL_7B) == PRESETS["mistral-7b"].replace(name="hf-mistral", seq_len=8192,
                                                                         vocab_pad_to=1)


def test_defaults_of_optional_keys():
    hf = {k: v for k, v in LLAMA3_8B.items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    c = config_from_hf(hf)
    assert c.groups == c.heads == 32 and not c.tie_embeddings
    assert config_from_hf({**LLAMA3_8B, "num_key_value_heads": None}).groups == 32
    assert config_from_hf({**LLAMA3_8B, "max_position_embeddings": 131072}).seq_len == 8192
    assert config_from_hf({**LLAMA3_8B, "max_position_embeddings": 2048}).seq_len == 2048


def test_head_dim_key():
    # Mistral-Nemo style: 32 heads of 128 over h 5120
    c = config_from_hf({**MISTRAL_7B, "hidden_size": 5120, "head_dim": 128})
    assert c.head_size == 128 and build(c).dims["d"] == 128
    assert config_from_hf(to_hf(c, "mistral")) == c
    # with head_dim given, heads need not divide hidden_size
    assert config_from_hf({**LLAMA3_8B, "num_attention_heads": 24, "head_dim": 128}).head_size == 128


def test_model_types_on_export():
    assert to_hf(PRESETS["llama3-8b"])["model_type"] == "llama"
    assert to_hf(PRESETS["qwen2.5-72b"])["model_type"] == "qwen2"
    assert to_hf(PRESETS["mistral-7b"], "mistral")["architectures"] == ["MistralForCausalLM"]
    with pytest.raises(UsageError, match="qkv_bias"):
        to_hf(PRESETS["qwen2.5-7b"], "llama")
    with pytest.raises(UsageError, match="qkv_bias"):
        to_hf(PRESETS["llama3-8b"], "qwen2")
    with pytest.raises(UsageError, match="gpt2"):
        to_hf(PRESETS["llama3-8b"], "gpt2")
    assert PRESETS["llama3-8b"].to_hf() == to_hf(PRESETS["llama3-8b"])


def test_config_file_path_and_folder(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN25_7B))
    assert config_from_hf(path).qkv_bias
    assert config_from_hf(str(path)).layers == 28
    assert config_from_hf(tmp_path).groups == 4


def test_configs_without_the_decoder_keys_are_not_ours():
    assert config_from_hf({"model_type": "gpt2", "n_embd": 768}) is None
    assert config_from_hf({"hidden_size": 4096}) is None
    # the keys decide, not the model_type: Mistral's keys under another name read the same
    assert config_from_hf({**MISTRAL_7B, "model_type": "my-own"}) == config_from_hf(MISTRAL_7B).replace(
        name="hf-my-own")


@pytest.mark.parametrize(
    "change,key",
    [
        ({"num_attention_heads": 30}, "num_attention_heads"),  # 30 does not divide 4096
        ({"num_key_value_heads": 5}, "num_key_value_heads"),  # 5 does not divide 32
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"num_hidden_layers": -1}, "num_hidden_layers"),
        ({"intermediate_size": 14336.5}, "intermediate_size"),
        ({"vocab_size": "128256"}, "vocab_size"),
        ({"head_dim": 0}, "head_dim"),
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"attention_bias": "yes"}, "attention_bias"),
        ({"use_qk_norm": True}, "use_qk_norm"),
        ({"post_layer_norm": False}, "post_layer_norm"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
        ({"stage": {"seq_len": 16384}}, "seq_len"),  # beyond max_position_embeddings
        ({"stage": {"attention": "ring"}}, "attention"),
        ({"stage": {"heads": 8}}, "stage.heads"),
        ({"stage": []}, "stage"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(change, key):
    with pytest.raises(UsageError, match=key.replace(".", r"\.")):
        config_from_hf({**LLAMA3_8B, **change})


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "vocab_size", "max_position_embeddings"])
def test_missing_required_keys_are_named(key):
    hf = {k: v for k, v in LLAMA3_8B.items() if k != key}
    with pytest.raises(UsageError, match=f"'{key}'"):
        read(HFKeys(hf))


def test_unreadable_files(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        config_from_hf(tmp_path / "nope" / "config.json")
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2]")
    with pytest.raises(UsageError, match="JSON object"):
        config_from_hf(bad)


def test_export_is_plain_json():
    c = PRESETS["llama3-405b"]
    assert json.loads(json.dumps(to_hf(c))) == to_hf(c)
    assert isinstance(config_from_hf(to_hf(c)), LlamaConfig)


def test_mistral_sliding_window():
    c = config_from_hf(MISTRAL_7B)
    assert c.sliding_window == 4096
    assert config_from_hf({**MISTRAL_7B, "sliding_window": None}).sliding_window is None  # Mistral 7B v0.2
    assert config_from_hf(LLAMA3_8B).sliding_window is None
    assert to_hf(c)["model_type"] == "mistral" and config_from_hf(to_hf(c)) == c
    with pytest.raises(UsageError, match="sliding_window"):
        to_hf(c, "llama")
    with pytest.raises(UsageError, match="use_sliding_window"):
        config_from_hf({**QWEN25_7B, "use_sliding_window": True})
    with pytest.raises(UsageError, match="'sliding_window'"):
        config_from_hf({**MISTRAL_7B, "sliding_window": 0})
