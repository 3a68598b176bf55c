"""Parameter counts against published totals (exact where the publisher gives them exactly)."""

from __future__ import annotations

import pytest
from stage_core.api import param_counts

from stage_model_llama import PRESETS, build

#: Hugging Face Hub ``safetensors.total`` of each model's repository (exact element counts)
HF_TOTAL = {
    "llama3-8b": 8_030_261_248,  # meta-llama/Meta-Llama-3-8B (and Llama-3.1-8B)
    "llama3-70b": 70_553_706_496,  # meta-llama/Meta-Llama-3-70B (and Llama-3.1-70B)
    "llama3-405b": 405_853_388_800,  # meta-llama/Llama-3.1-405B
    "mistral-7b": 7_241_732_096,  # mistralai/Mistral-7B-v0.1
    "qwen2.5-7b": 7_615_616_512,  # Qwen/Qwen2.5-7B
    "qwen2.5-72b": 72_706_203_648,  # Qwen/Qwen2.5-72B
}

#: Llama 2 checkpoints on the Hub also store each layer's rotary ``inv_freq`` buffer (d/2
#: elements per layer, not a parameter): safetensors.total minus layers·d/2 is the model's
#: parameter count (transformers' num_parameters()).
HF_TOTAL_WITH_ROPE_BUFFERS = {
    "llama2-7b": 6_738_417_664,  # meta-llama/Llama-2-7b-hf
    "llama2-13b": 13_015_866_880,  # meta-llama/Llama-2-13b-hf
    "llama2-70b": 68_976_653_312,  # meta-llama/Llama-2-70b-hf
}

#: rounded totals as stated in the REFERENCE / model cards
ROUNDED = {
    "llama2-70b": 68.98e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "llama3-405b": 405.8e9,
}


def total(config) -> int:
    return param_counts(build(config))[0]


@pytest.mark.parametrize("name", sorted(HF_TOTAL))
def test_exact_hub_counts(name):
    assert total(PRESETS[name]) == HF_TOTAL[name]


@pytest.mark.parametrize("name", sorted(HF_TOTAL_WITH_ROPE_BUFFERS))
def test_llama2_hub_counts_less_rope_buffers(name):
    c = PRESETS[name]
    assert total(c) == HF_TOTAL_WITH_ROPE_BUFFERS[name] - c.layers * c.head_size // 2


@pytest.mark.parametrize("name", sorted(ROUNDED))
def test_within_half_a_percent_of_published(name):
    n = total(PRESETS[name])
    assert abs(n - ROUNDED[name]) <= 0.005 * ROUNDED[name]


def test_count_by_hand_llama3_8b():
    # embeddings 2·V·h; per layer q and o a·d·h each, k and v g·d·h each, MLP 3·h·f, 2 norms h;
    # final norm h
    V, h, L, a, g, d, f = 128256, 4096, 32, 32, 8, 128, 14336
    by_hand = 2 * V * h + L * (2 * a * d * h + 2 * g * d * h + 3 * h * f + 2 * h) + h
    assert total(PRESETS["llama3-8b"]) == by_hand


def test_qkv_bias_and_tied_embeddings():
    c = PRESETS["qwen2.5-7b"]
    # Qwen2 biases q, k and v: (a + 2g)·d per layer
    assert total(c) - total(c.replace(qkv_bias=False)) == c.layers * (c.heads + 2 * c.groups) * c.head_size
    assert total(c) - total(c.replace(tie_embeddings=True)) == c.padded_vocab * c.hidden


def test_small_tied_qwen():
    # Qwen/Qwen2.5-0.5B: tied embeddings, 24 layers, h 896, 14 heads, 2 KV heads, f 4864,
    # vocab 151936; the Hub lists 494,032,768 parameters
    from stage_model_llama import LlamaConfig

    c = LlamaConfig(name="qwen2.5-0.5b", layers=24, hidden=896, heads=14, kv_heads=2, ffn_hidden=4864,
                    vocab_size=151936, max_positions=32768, seq_len=4096, tie_embeddings=True, qkv_bias=True)
    assert total(c) == 494_032_768


def test_vocabulary_padding():
    c = PRESETS["llama-tiny"].replace(vocab_size=500)
    assert c.padded_vocab == 512
    assert total(c) == total(PRESETS["llama-tiny"])
    assert c.replace(vocab_pad_to=1).padded_vocab == 500
