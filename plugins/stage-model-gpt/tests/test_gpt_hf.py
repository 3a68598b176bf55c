"""Hugging Face config.json import (model_type gpt2) and export."""

from __future__ import annotations

import json

import pytest
from stage_core.api import HFKeys, UsageError, param_counts

from stage_model_gpt import PRESETS, GPTConfig, build, config_from_hf, to_hf
from stage_model_gpt.hf import read

#: the keys of openai-community/gpt2's published config.json that matter here
GPT2_CONFIG_JSON = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "vocab_size": 50257,
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
def test_round_trip_through_plain_hf_keys(name):
    # without STAGE's own "stage" object the model (params and dims) is still the same
    c = PRESETS[name]
    hf = to_hf(c)
    del hf["stage"]
    back = config_from_hf(hf)
    if c.vocab_pad_to == 128:  # the default padding
        assert build(back).dims == build(c).dims
        assert param_counts(build(back)) == param_counts(build(c))
    assert (back.layers, back.hidden, back.heads, back.ffn, back.max_positions) == (
        c.layers, c.hidden, c.heads, c.ffn, c.max_positions)


def test_public_gpt2_config_gives_the_gpt2_preset():
    c = config_from_hf(GPT2_CONFIG_JSON)
    assert c == PRESETS["gpt2"].replace(name="hf-gpt2")


def test_n_inner_and_tie():
    c = config_from_hf({**GPT2_CONFIG_JSON, "n_inner": 2048, "tie_word_embeddings": False})
    assert c.ffn == 2048 and not c.tie_embeddings
    assert config_from_hf({**GPT2_CONFIG_JSON, "n_inner": None}).ffn == 4 * 768


def test_config_file_path_and_folder(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2_CONFIG_JSON))
    assert config_from_hf(path).layers == 12
    assert config_from_hf(str(path)).hidden == 768
    assert config_from_hf(tmp_path).heads == 12


def test_other_model_types_are_not_ours(tmp_path):
    assert config_from_hf({"model_type": "llama", "hidden_size": 4096}) is None
    assert config_from_hf({"n_embd": 768}) is None
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mistral"}))
    assert config_from_hf(path) is None


@pytest.mark.parametrize(
    "change,key",
    [
        ({"n_head": 7}, "n_head"),  # 7 does not divide 768
        ({"n_embd": 770}, "n_embd"),
        ({"n_layer": 0}, "n_layer"),
        ({"n_layer": -2}, "n_layer"),
        ({"n_embd": 768.0}, "n_embd"),
        ({"vocab_size": "50257"}, "vocab_size"),
        ({"n_inner": 0}, "n_inner"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({"stage": {"seq_len": 4096}}, "seq_len"),  # longer than n_positions
        ({"stage": {"attention": "sparse"}}, "attention"),
        ({"stage": {"vocab_pad": 64}}, "stage.vocab_pad"),
        ({"stage": []}, "stage"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(change, key):
    with pytest.raises(UsageError, match=key.replace(".", r"\.")):
        config_from_hf({**GPT2_CONFIG_JSON, **change})


@pytest.mark.parametrize("key", ["n_embd", "n_layer", "n_head", "vocab_size"])
def test_missing_required_keys_are_named(key):
    hf = dict(GPT2_CONFIG_JSON)
    del hf[key]
    with pytest.raises(UsageError, match=f"'{key}'"):
        read(HFKeys(hf))


def test_missing_positions():
    hf = {k: v for k, v in GPT2_CONFIG_JSON.items() if k not in ("n_positions", "n_ctx")}
    with pytest.raises(UsageError, match="'n_positions'"):
        config_from_hf(hf)
    assert config_from_hf({**hf, "n_ctx": 512}).max_positions == 512  # the older key


def test_unreadable_files(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        config_from_hf(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        config_from_hf(bad)


def test_to_hf_is_json_and_a_method():
    c = PRESETS["gpt3-175b"]
    assert json.loads(json.dumps(c.to_hf())) == to_hf(c)
    assert to_hf(c)["vocab_size"] == 50257 and to_hf(c)["stage"]["vocab_pad_to"] == 1024
    assert isinstance(config_from_hf(c.to_hf()), GPTConfig)
