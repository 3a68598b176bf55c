"""Published config.json files of 2024-25 Llama-shaped models read by their keys, with the
parameter count of each checkpoint.

The files are in ``configs/``.  Sources of the files: Qwen3-0.6B, internlm2_5-7b-chat,
MiniCPM-2B-sft-bf16, chatglm3-6b, starcoder2-7b and aya-23-8B as mlc-ai/mlc-llm reproduces
each repository's config.json (python/mlc_llm/model/model_preset.py); falcon-7b,
granite-3.0-8b-base, glm-4-9b and glm-4-9b-chat-hf from their Hugging Face repositories
(tiiuae/, ibm-granite/, THUDM/).  Each count is computed from the graph the family builds;
the published figures are below with where each comes from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stage_core.api import hf_import_of, param_counts
from stage_core.testing import fresh_host

from stage_model_llama import build, plugin

CONFIGS = Path(__file__).parent / "configs"

#: model: (its config.json in configs/, the published parameter count, where it is published)
PUBLISHED = {
    "qwen3-0.6b": ("Qwen3-0.6B", 596_049_920, "transformers num_parameters() of Qwen/Qwen3-0.6B"),
    "internlm2.5-7b": ("internlm2_5-7b-chat", 7_737_708_544, "safetensors total of internlm/internlm2_5-7b-chat"),
    "minicpm-2b": ("MiniCPM-2B-sft-bf16", 2_724_880_896, "n_parameters of openbmb/MiniCPM-2B-sft-bf16 (MTEB)"),
    "chatglm3-6b": ("chatglm3-6b", 6_243_584_000, "num_parameters() of THUDM/chatglm3-6b"),
    "glm-4-9b": ("glm-4-9b", 9_399_951_360, "num_parameters() of THUDM/glm-4-9b-chat"),
    "glm-4-9b-hf": ("glm-4-9b-chat-hf", 9_399_951_360, "the same weights as model_type glm"),
    "starcoder2-7b": ("starcoder2-7b", 7_173_923_840, "safetensors total of bigcode/starcoder2-7b"),
    "aya-23-8b": ("aya-23-8B", 8_028_033_024, "safetensors total of CohereForAI/aya-expanse-8b (aya-23-8B's "
                                              "architecture and size)"),
    # the Hub's safetensors total of tiiuae/falcon-7b, 7,217,189,760, stores the tied
    # embedding twice (word_embeddings and lm_head): less V·h = 65,024 x 4,544
    "falcon-7b": ("falcon-7b", 7_217_189_760 - 65_024 * 4_544, "tiiuae/falcon-7b safetensors total less its tied "
                                                                "head"),
}
#: model cards that give a rounded count only: (file, count, relative tolerance of the rounding)
ROUNDED = {
    "granite-3.0-8b": ("granite-3.0-8b-base", 8.17e9, 0.0007),  # ibm-granite/granite-3.0-8b-base: "8.17B"
}


def load(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def imported(name: str):
    host = fresh_host((plugin, "llama"))
    return host.config_from_hf(load(name))


def total(config) -> int:
    return param_counts(build(config))[0]


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_published_config_imports_with_the_checkpoints_count(model):
    name, count, _source = PUBLISHED[model]
    config = imported(name)
    assert config.family == "llama"
    assert total(config) == count


@pytest.mark.parametrize("model", sorted(ROUNDED))
def test_published_config_against_the_model_cards_rounding(model):
    name, count, tolerance = ROUNDED[model]
    assert abs(total(imported(name)) - count) <= tolerance * count


def test_what_each_config_says_is_modelled():
    qwen3 = imported("Qwen3-0.6B")
    assert (qwen3.qk_norm, qwen3.tie_embeddings, qwen3.head_size, qwen3.sliding_window) == ("head", True, 128, None)
    star = imported("starcoder2-7b")
    assert (star.norm, star.norm_bias, star.mlp_act, star.qkv_bias, star.proj_bias, star.mlp_bias) == \
        ("layernorm", True, "gelu", True, True, True)
    assert star.sliding_window == 4096
    aya = imported("aya-23-8B")
    assert (aya.parallel_block, aya.parallel_norms, aya.norm, aya.norm_bias, aya.tie_embeddings) == \
        (True, 1, "layernorm", False, True)
    falcon = imported("falcon-7b")
    assert (falcon.kv_heads, falcon.ffn_hidden, falcon.parallel_block, falcon.mlp_act, falcon.max_positions) == \
        (1, 4 * 4544, True, "gelu", 2048)
    glm = imported("glm-4-9b")
    assert (glm.kv_heads, glm.head_size, glm.qkv_bias, glm.proj_bias, glm.ffn_hidden) == (2, 128, True, False, 13696)
    hf = imported("glm-4-9b-chat-hf")  # the same model as transformers' glm: the same graph
    assert build(hf).dims == build(glm).dims and (hf.qkv_bias, hf.proj_bias) == (True, False)
    minicpm = imported("MiniCPM-2B-sft-bf16")
    assert minicpm.embed_multiplier == 12 and minicpm.padded_vocab == 122753
    assert imported("granite-3.0-8b-base").embed_multiplier == 12
    internlm = imported("internlm2_5-7b-chat")
    assert not (internlm.qkv_bias or internlm.proj_bias or internlm.mlp_bias)


def test_counts_by_hand():
    # Falcon 7B: a fused QKV of 71 query heads and one key and value head of 64, the output
    # projection, a 4h GeLU MLP without biases, one LayerNorm (weight and bias) per layer,
    # the final LayerNorm and one tied table
    V, h, L, a, d = 65024, 4544, 32, 71, 64
    falcon = h * (a + 2) * d + h * h + 2 * h * 4 * h + 2 * h
    assert total(imported("falcon-7b")) == V * h + L * falcon + 2 * h
    # StarCoder2 7B: biases on q, k, v, o and both MLP projections, two LayerNorms with bias
    V, h, L, a, g, d, f = 49152, 4608, 32, 36, 4, 128, 18432
    layer = 2 * a * d * h + 2 * g * d * h + (a + 2 * g) * d + h + 2 * h * f + f + h + 4 * h
    assert total(imported("starcoder2-7b")) == V * h + L * layer + 2 * h


def test_ignored_keys_are_listed():
    record = hf_import_of(imported("glm-4-9b-chat-hf"))
    assert "partial_rotary_factor" in record["ignored_keys"] and "hidden_size" not in record["ignored_keys"]
    assert record["family"] == "llama" and record["model_type"] == "glm"


def test_an_unknown_model_type_reads_as_llama_reads_it():
    data = {**load("internlm2_5-7b-chat"), "model_type": "never-heard-of"}
    assert total(fresh_host((plugin, "llama")).config_from_hf(data)) == PUBLISHED["internlm2.5-7b"][1]
