"""Published config.json files of 2024-25 MoE models read by their keys, with the parameter
count of each checkpoint.

The files are in ``configs/``.  Sources: DeepSeek-V2-Lite as mlc-ai/mlc-llm reproduces
deepseek-ai/DeepSeek-V2-Lite's config.json (python/mlc_llm/model/model_preset.py);
OLMoE-1B-7B-0924 as NVIDIA-NeMo/Megatron-Bridge reproduces it
(tests/unit_tests/models/olmoe/test_olmoe_bridge.py); Llama-4-Maverick-17B-128E as
NVIDIA/TensorRT-LLM reproduces it (its unit test of Llama 4, with the published 48 layers
and 34 vision layers where the test cuts them); gpt-oss-20b and Phi-3.5-MoE-instruct
from their repositories (openai/, microsoft/; Phi-3.5-MoE's rope_scaling factor lists
left out).  Each count is computed from the graph the family builds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stage_core.api import hf_import_of, layer_kinds, param_counts
from stage_core.testing import fresh_host

from stage_model_moe import build, plugin

CONFIGS = Path(__file__).parent / "configs"

#: model: (config file, published total, published active or None, where they are published)
PUBLISHED = {
    "deepseek-v2-lite": ("DeepSeek-V2-Lite", 15_706_484_224, "num_parameters() of deepseek-ai/DeepSeek-V2-Lite"),
    "olmoe-1b-7b": ("OLMoE-1B-7B-0924", 6_919_161_856, "safetensors total of allenai/OLMoE-1B-7B-0924"),
    "phi-3.5-moe": ("Phi-3.5-MoE-instruct", 41_873_153_344, "num_parameters() of microsoft/Phi-3.5-MoE-instruct"),
    "gpt-oss-20b": ("gpt-oss-20b", 20_914_757_184, "safetensors total of openai/gpt-oss-20b (general.parameter_count)"),
}
#: Llama-4-Maverick-17B-128E's checkpoint, vision tower included (its total as Fireworks lists it)
MAVERICK_CHECKPOINT = 401_583_781_376


def load(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def imported(name: str):
    return fresh_host((plugin, "moe")).config_from_hf(load(name))


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_published_config_imports_with_the_checkpoints_count(model):
    name, count, _source = PUBLISHED[model]
    config = imported(name)
    assert config.family == "moe"
    assert param_counts(build(config))[0] == count


def llama4_vision_tower(v: dict, text_hidden: int) -> int:
    """Llama 4's vision encoder and projector, counted by hand from vision_config (what the
    text model leaves out): the patch embedding (no bias), class and position embeddings,
    two LayerNorms, per layer q, k, v, o and both MLP projections with biases and two
    LayerNorms, the pixel-shuffle MLP (two projections, no bias) and the projector to the
    text width (no bias)."""
    h, f, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    patches = (v["image_size"] // p) ** 2
    shuffled = int(h / v["pixel_shuffle_ratio"] ** 2)
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    return (v["num_channels"] * p * p * h + h + (patches + 1) * h + 2 * 2 * h + v["num_hidden_layers"] * layer
            + shuffled * v["projector_input_dim"] + v["projector_input_dim"] * v["projector_output_dim"]
            + v["vision_output_dim"] * text_hidden)


def test_llama4_maverick_text_model_and_its_vision_tower_make_the_checkpoint():
    data = load("Llama-4-Maverick-17B-128E")
    config = imported("Llama-4-Maverick-17B-128E")
    total, active = param_counts(build(config))
    assert total + llama4_vision_tower(data["vision_config"], config.hidden) == MAVERICK_CHECKPOINT
    assert "vision_config" in hf_import_of(config)["ignored_keys"]  # listed, as Gemma 3's
    # "17B active": one routed and the shared expert of 128 per MoE layer
    assert abs(active - 17e9) < 0.02 * 17e9


def test_what_each_config_says_is_modelled():
    maverick = imported("Llama-4-Maverick-17B-128E")
    assert (maverick.moe_layers[:3], maverick.shared_expert_ffn_hidden, maverick.ffn_hidden) == ((1, 3, 5), 8192,
                                                                                                  16384)
    assert (maverick.router_score, maverick.experts_per_token, maverick.global_every) == ("sigmoid", 1, 4)
    assert layer_kinds(build(maverick)) == {"attention (window 4096) + mlp": 24, "attention (window 4096) + moe": 12,
                                            "attention + moe": 12}
    oss = imported("gpt-oss-20b")
    assert (oss.attn_sinks, oss.router_bias, oss.expert_bias, oss.proj_bias, oss.qkv_bias) == (True,) * 5
    assert layer_kinds(build(oss)) == {"attention (window 128) + moe": 12, "attention + moe": 12}
    olmoe = imported("OLMoE-1B-7B-0924")
    assert (olmoe.qk_norm, olmoe.qk_norm_span, olmoe.norm_topk_prob) == (True, "all", False)
    phi = imported("Phi-3.5-MoE-instruct")
    assert (phi.norm, phi.norm_bias, phi.lm_head_bias, phi.proj_bias, phi.padded_vocab) == ("layernorm", True, True,
                                                                                            True, 32064)
    lite = imported("DeepSeek-V2-Lite")
    assert (lite.attention_type, lite.q_lora_rank, lite.first_dense_layers, lite.shared_expert_ffn_hidden) == \
        ("mla", None, 1, 2 * 1408)


def test_active_parameters_as_published():
    # gpt-oss's model card: 3.61B active, the unembedding counted and the input embedding not
    config = imported("gpt-oss-20b")
    active = param_counts(build(config))[1]
    assert abs(active - config.padded_vocab * config.hidden - 3.61e9) < 0.005e9
    # OLMoE: "1.3B active"; DeepSeek-V2-Lite: "2.4B activated" (without the input embedding)
    assert abs(param_counts(build(imported("OLMoE-1B-7B-0924")))[1] - 1.3e9) < 0.05e9
    lite = imported("DeepSeek-V2-Lite")
    assert abs(param_counts(build(lite))[1] - lite.padded_vocab * lite.hidden - 2.4e9) < 0.1e9


def test_counts_by_hand_gpt_oss_layer():
    # per layer: q, k, v, o with biases, one sink per head, a router with a bias, 32 experts of
    # gate/up [h, 2f] and down [f, h] with biases, two RMSNorms
    h, a, g, d, E, f = 2880, 64, 8, 64, 32, 2880
    attn = h * a * d + a * d + 2 * (h * g * d + g * d) + a * d * h + h + a
    moe = h * E + E + E * (h * 2 * f + 2 * f + f * h + h)
    V, L = 201088, 24
    assert param_counts(build(imported("gpt-oss-20b")))[0] == 2 * V * h + L * (attn + moe + 2 * h) + h
