"""A Mamba layer keeps activations linear in the sequence length: no s² term, and its state
is a fixed size per sequence.

Saved for backward per token of one Mamba layer, 16-bit unless noted: the layer input
(the norm's) 2h and the norm's output (in_proj's input) 2h; the conv's input, the xBC part
of in_proj's output, 2·(H·P + 2·G·N); the conv's output split into x, B, C, 2·(H·P + 2·G·N);
dt 2H; the scan's output y 2·H·P and its fp32 dA_cumsum 4H; the gate z 2·H·P; the gated
norm's output (out_proj's input) 2·H·P:  (4h + 10·H·P + 8·G·N + 6H) · b · s bytes.
"""

from __future__ import annotations

import pytest
from stage_core.api import differentiate, saved_bytes_per_layer, step_values

from stage_model_ssm import PRESETS, build


def by_hand(c, b: int, s: int) -> int:
    h, H, P, G, N = c.hidden, c.ssm_heads, c.ssm_head_dim, c.ssm_groups, c.ssm_state
    return (4 * h + 10 * H * P + 8 * G * N + 6 * H) * b * s


@pytest.mark.parametrize("name", ["mamba2-2.7b", "nemotron-h-8b"])
def test_mamba_layer_activations_are_linear_in_s(name):
    c = PRESETS[name]
    tg = differentiate(build(c))
    layer = c.layer_indices("mamba")[0]
    at = {s: saved_bytes_per_layer(tg, step_values(tg, 1, s))[layer] for s in (2048, 4096, 8192)}
    assert at[2048] == by_hand(c, 1, 2048)
    assert at[4096] == 2 * at[2048] and at[8192] == 4 * at[2048]  # no s² term


def test_mamba2_2_7b_layer_number():
    # (4·2560 + 10·80·64 + 8·1·128 + 6·80) bytes per token: 62,944
    c = PRESETS["mamba2-2.7b"]
    tg = differentiate(build(c))
    assert saved_bytes_per_layer(tg, step_values(tg, 1, 2048))[0] == 62_944 * 2048


def test_attention_layers_of_the_hybrid_are_quadratic_with_classic_attention():
    # the contrast: classic attention keeps the s×s probabilities, a Mamba layer nothing like them
    c = PRESETS["hybrid-tiny"].replace(attention="classic")
    tg = differentiate(build(c))
    attn, mamba = c.layer_indices("attention")[0], c.layer_indices("mamba")[0]
    small, large = (saved_bytes_per_layer(tg, step_values(tg, 1, s)) for s in (256, 512))
    assert large[mamba] == 2 * small[mamba]
    assert large[attn] - 2 * small[attn] == 2 * c.heads * (512 * 512 - 2 * 256 * 256)  # bf16 probabilities


def test_recurrent_state_is_fixed_per_sequence():
    # what an inference cache of a Mamba layer holds, whatever the context: the SSM state
    # H·P·N and the conv's last k−1 inputs of its H·P + 2·G·N channels
    c = PRESETS["nemotron-h-8b"]
    meta = build(c).meta
    assert meta["ssm_state_elements_per_layer"] == 128 * 64 * 128 == 1_048_576
    assert meta["conv_state_elements_per_layer"] == 3 * (8192 + 2 * 8 * 128) == 30_720
    assert meta["mamba_layers"] == list(c.layer_indices("mamba")) and len(meta["mamba_layers"]) == 24
