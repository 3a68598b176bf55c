"""Parameter counts against published totals, with the source of each."""

from __future__ import annotations

from stage_core.api import param_counts

from stage_model_ssm import PRESETS, build


def total(c) -> int:
    return param_counts(build(c))[0]


def mamba_layer_by_hand(c) -> int:
    # in_proj h·(2·d_in + 2·G·N + H); conv (d_in + 2·G·N)·(k + 1) with its bias; A_log, D and
    # dt_bias H each; the gated norm d_in; out_proj d_in·h; the layer's norm h
    h, d_in, G, N, H, k = c.hidden, c.ssm_inner, c.ssm_groups, c.ssm_state, c.ssm_heads, c.conv_kernel
    return h * (2 * d_in + 2 * G * N + H) + (d_in + 2 * G * N) * (k + 1) + 3 * H + d_in + d_in * h + h


def test_mamba2_2_7b_against_the_paper():
    # "Mamba-2 2.7B" (Dao & Gu 2024, arXiv 2405.21060; state-spaces/mamba2-2.7b)
    c = PRESETS["mamba2-2.7b"]
    n = total(c)
    assert n == 64 * mamba_layer_by_hand(c) + 50288 * 2560 + 2560 == 2_702_599_680
    assert abs(n - 2.7e9) <= 0.005 * 2.7e9


def test_nemotron_h_8b_against_its_checkpoint():
    # 8,100,852,736: the parameters of nvidia/Nemotron-H-8B-Base-8K loaded with transformers, as
    # tallied tensor by tensor in YVSemlani/esfomo3-quantization nemotron_architecture_summary.md
    # (in_proj 18560 × 4096 per Mamba layer, ...); the model card's name says 8B
    c = PRESETS["nemotron-h-8b"]
    h, V, f = 4096, 131072, 21504
    attention = h * (32 + 2 * 8) * 128 + 32 * 128 * h + h
    by_hand = 2 * V * h + h + 24 * mamba_layer_by_hand(c) + 4 * attention + 24 * (2 * h * f + h)
    assert total(c) == by_hand == 8_100_852_736
    assert abs(total(c) - 8.1e9) <= 0.005 * 8.1e9


def test_moe_layers_count_active_experts():
    c = PRESETS["hybrid-tiny"]
    g = build(c)
    n_total, active = param_counts(g)
    expert = 2 * c.hidden * c.expert_ffn_hidden  # up and down (squared ReLU)
    moe_layers = len(c.layer_indices("moe"))
    assert n_total - active == moe_layers * (c.experts - c.experts_per_token) * expert
