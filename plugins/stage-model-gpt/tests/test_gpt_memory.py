"""Saved activations of one GPT layer against Korthikanti et al. 2022 (arXiv 2205.05198).

Table 2, no parallelism: s·b·h·(34 + 5·a·s/h) bytes per layer with 16-bit activations
and 1-byte dropout masks.  The 34 per token per hidden unit: attention 11 (QKV input 2,
Q and K 4, V 2, projection input 2, dropout mask 1), MLP 19 (input 2, fc1 output 8,
GeLU output 8, dropout mask 1), two layer norms 4; the 5·a·s/h term is the softmax
output (2), its dropout mask (1) and the dropout output (2) over the a·s×s scores.
"""

from __future__ import annotations

import pytest
from stage_core.api import differentiate, saved_bytes_per_layer, step_values

from stage_model_gpt import PRESETS, GPTConfig, build


def korthikanti(s, b, h, a):
    return s * b * h * 34 + 5 * a * s * s * b


CASES = [
    ("gpt3-175b", 1, 2048),
    ("gpt3-175b", 2, 1024),
    ("megatron-18b", 4, 2048),
    ("gpt2", 3, 1024),
    ("gpt-tiny", 1, 256),
]


@pytest.mark.parametrize("name,b,s", CASES)
def test_classic_layer_matches_korthikanti(name, b, s):
    c = PRESETS[name].replace(attention="classic")
    tg = differentiate(build(c))
    per_layer = saved_bytes_per_layer(tg, step_values(tg, b, s))
    assert sorted(per_layer) == list(range(c.layers))
    expected = korthikanti(s, b, c.hidden, c.heads)
    assert set(per_layer.values()) == {expected}


def test_gpt3_layer_by_hand():
    # GPT-3 175B, s 2048, b 1, no parallelism: s·b·h = 25,165,824 and 5·a·s/h = 80,
    # so 25,165,824 × 114 bytes = 2.671875 GiB per layer (the REFERENCE's TP=8 figure,
    # s·b·h·(10 + 24/8 + 80/8) = 0.539 GiB, is this with t = 8).
    tg = differentiate(build(PRESETS["gpt3-175b"].replace(attention="classic")))
    (per_layer,) = set(saved_bytes_per_layer(tg, step_values(tg, 1, 2048)).values())
    assert per_layer == 25_165_824 * 114
    assert per_layer / 2**30 == 2.671875


@pytest.mark.parametrize("name,b,s", CASES)
def test_flash_layer_drops_the_score_terms(name, b, s):
    # Flash keeps q, k, v, its output (the projection's input, counted once) and the
    # fp32 log-sum-exp, one per query row per head: 4·a·s·b bytes, instead of 5·a·s²·b.
    c = PRESETS[name].replace(attention="flash")  # (megatron-* presets run classic attention, as in 2021)
    tg = differentiate(build(c))
    per_layer = saved_bytes_per_layer(tg, step_values(tg, b, s))
    assert set(per_layer.values()) == {34 * s * b * c.hidden + 4 * c.heads * s * b}


def test_untied_head_and_ffn_width_change_only_what_they_should():
    # fc1 output and GeLU output are 2 bytes per FFN unit each: 4·s·b·f instead of 16·s·b·h
    c = GPTConfig(layers=1, hidden=64, heads=4, ffn_hidden=96, vocab_size=100, max_positions=32, seq_len=32,
                  attention="classic", tie_embeddings=False)
    tg = differentiate(build(c))
    (per_layer,) = saved_bytes_per_layer(tg, step_values(tg, 2, 32)).values()
    s, b, h, a, f = 32, 2, 64, 4, 96
    assert per_layer == s * b * (18 * h + 4 * f) + 5 * a * s * s * b
