"""Saved activations of one LLaMA layer, counted by hand.

Per token, 16-bit: attention norm input 2h, QKV input 2h, q after RoPE 2·a·d, k after
RoPE and v 2·g·d each, attention output 2·a·d (also the projection's input, kept once),
MLP norm input 2h, gate/up input 2h (one tensor read by both), gate and up outputs 2f
each, SwiGLU output 2f: (8h + 4ad + 4gd + 6f)·s·b bytes.  Then flash keeps the fp32
log-sum-exp, 4·a·s·b bytes; classic keeps the softmax output, 2·a·s²·b bytes (no
dropout in this family).
"""

from __future__ import annotations

import pytest
from stage_core.api import differentiate, saved_bytes_per_layer, step_values

from stage_model_llama import PRESETS, build


def by_hand(c, s, b):
    h, a, g, d, f = c.hidden, c.heads, c.groups, c.head_size, c.ffn_hidden
    return (8 * h + 4 * a * d + 4 * g * d + 6 * f) * s * b


@pytest.mark.parametrize("name,b,s", [("llama3-8b", 1, 8192), ("llama2-70b", 2, 4096), ("qwen2.5-7b", 1, 4096),
                                      ("llama-tiny", 3, 256)])
def test_layer_activations(name, b, s):
    c = PRESETS[name]
    tg = differentiate(build(c))
    per_layer = saved_bytes_per_layer(tg, step_values(tg, b, s))
    assert sorted(per_layer) == list(range(c.layers))
    assert set(per_layer.values()) == {by_hand(c, s, b) + 4 * c.heads * s * b}

    tg = differentiate(build(c.replace(attention="classic")))
    per_layer = saved_bytes_per_layer(tg, step_values(tg, b, s))
    assert set(per_layer.values()) == {by_hand(c, s, b) + 2 * c.heads * s * s * b}


def test_llama3_8b_number():
    # s 8192, b 1: (8·4096 + 4·4096 + 4·1024 + 6·14336)·8192 + 4·32·8192 bytes
    c = PRESETS["llama3-8b"]
    tg = differentiate(build(c))
    (per_layer,) = set(saved_bytes_per_layer(tg, step_values(tg, 1, 8192)).values())
    assert per_layer == 1_140_850_688 + 1_048_576
