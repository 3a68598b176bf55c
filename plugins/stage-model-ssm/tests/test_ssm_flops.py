"""FLOPs of the SSD scan, a Mamba-2 layer and whole models, against hand counts.

The SSD algorithm (Dao & Gu 2024, "Transformers are SSMs", section 6) splits the sequence
of T tokens into chunks of Q and computes, with BMM(B, M, N, K) = 2·B·M·N·K FLOPs:
the diagonal blocks, C·Bᵀ BMM(T/Q, Q, Q, N) (once per group: heads of a group share B
and C) and its product with x BMM(T/Q, Q, P, Q) per head; the chunk states
BMM(T/Q, N, P, Q) per head; the outputs from the states BMM(T/Q, Q, P, N) per head; and
a scan of T/Q steps over the N·P state (elementwise).  Per token: 2·Q·N·G + 2·Q·P·H +
2·N·P·H + 2·N·P·H matmul FLOPs.
"""

from __future__ import annotations

import pytest
from stage_core.api import differentiate, evaluate_sum, flop_counts as kernels, step_values, training_flops

from stage_model_ssm import PRESETS, build


def ssd_forward_matmuls(c) -> int:
    """The paper's four BMM steps, per token of one Mamba layer."""
    Q, N, P, H, G = c.chunk_size, c.ssm_state, c.ssm_head_dim, c.ssm_heads, c.ssm_groups
    return 2 * Q * N * G + 2 * Q * P * H + 2 * N * P * H + 2 * N * P * H


def projections(c) -> int:
    """in_proj and out_proj per token, as Megatron-LM's mamba_layer_flops counts them (2 FLOPs per
    multiply-add): 2·h·(2·d_in + 2·G·N + H) + 2·d_in·h."""
    d_in, G, N, H, h = c.ssm_inner, c.ssm_groups, c.ssm_state, c.ssm_heads, c.hidden
    return 2 * h * (2 * d_in + 2 * G * N + H) + 2 * d_in * h


def layer_ops(graph, layer: int, phase: str = "forward"):
    tg = differentiate(graph) if phase != "forward" else graph
    return [op for op in tg.ops if op.layer == layer and op.phase == phase]


def test_mamba2_2_7b_forward_flops_per_token_by_hand():
    c = PRESETS["mamba2-2.7b"]
    # SSD, Q 256, N 128, P 64, H 80, G 1: 65,536 + 2,621,440 + 1,310,720 + 1,310,720
    assert ssd_forward_matmuls(c) == 5_308_416
    # in_proj 2·2560·10576 = 54,149,120; out_proj 2·5120·2560 = 26,214,400
    assert projections(c) == 80_363_520
    g = build(c)
    values = step_values(g, 1, 2048)
    (ssd,) = [op for op in layer_ops(g, 0) if op.fn == "ssd_scan"]
    assert evaluate_sum([ssd.matmul_flops], values) == 2048 * 5_308_416
    layer = evaluate_sum([op.matmul_flops for op in layer_ops(g, 0)], values)
    assert layer == 2048 * (5_308_416 + 80_363_520)
    # the whole model, per token: 64 layers and the tied head 2·2560·50288
    forward = evaluate_sum([op.matmul_flops for op in g.kernels()], values)
    assert forward == 2048 * (64 * 85_671_936 + 2 * 2560 * 50288) == 2048 * 5_740_478_464


def test_mamba2_2_7b_training_flops_per_token_by_hand():
    # projections and the head three times (forward, data and weight gradients); the scan's
    # backward twice its forward plus the recomputed C·Bᵀ and chunk states
    c = PRESETS["mamba2-2.7b"]
    Q, N, P, H, G = c.chunk_size, c.ssm_state, c.ssm_head_dim, c.ssm_heads, c.ssm_groups
    ssd = 3 * ssd_forward_matmuls(c) + 2 * Q * N * G + 2 * N * P * H
    per_token = 64 * (3 * projections(c) + ssd) + 3 * 2 * 2560 * 50288
    assert training_flops(build(c), b=1, s=2048) == 2048 * per_token
    # the scan is a small share of the model's matmuls (Megatron-LM's note: "small percent")
    assert 0.05 < 64 * ssd / per_token < 0.07


def test_ssd_kernel_other_flops_and_bytes_by_hand():
    c = PRESETS["mamba2-tiny"]  # Q 64, N 16, P 32, H 8, G 1
    g = build(c)
    s = 128
    (ssd,) = [op for op in layer_ops(g, 0) if op.fn == "ssd_scan"]
    Q, N, P, H, G = 64, 16, 32, 8, 1
    values = step_values(g, 1, s)
    other = s * (kernels.SSD_DT[0] * H + kernels.SSD_MASK[0] * Q * H + kernels.SSD_OUT[0] * H * P) \
        + kernels.SSD_PASS[0] * (s // Q) * H * P * N
    assert evaluate_sum([ssd.other_flops], values) == other
    # x read twice and y written (bf16); dt read, fp32 dt and dA_cumsum written and read twice;
    # B and C read twice; C·Bᵀ written and read; fp32 chunk states written, read, rewritten, read
    nbytes = s * (3 * 2 * H * P + (2 + 24) * H + 4 * 2 * G * N + 2 * 2 * G * Q) + 16 * (s // Q) * H * P * N
    assert evaluate_sum([ssd.bytes], values) == nbytes


def test_conv_flops_by_hand():
    c = PRESETS["mamba2-tiny"]
    g = build(c)
    (conv,) = [op for op in layer_ops(g, 0) if op.fn == "causal_conv1d"]
    channels = c.ssm_inner + 2 * c.ssm_groups * c.ssm_state  # x, B and C
    # forward: a multiply-add per tap, bias and SiLU; backward: 6 per tap and 11
    assert evaluate_sum([conv.flops], step_values(g, 2, 100)) == 2 * 100 * channels * (2 * 4 + 5)
    (bwd,) = [op for op in layer_ops(g, 0, "backward") if op.fn == "causal_conv1d_bwd"]
    assert evaluate_sum([bwd.flops], step_values(g, 2, 100)) == 2 * 100 * channels * (6 * 4 + 11)


@pytest.mark.parametrize("s", [2048, 8192])
def test_nemotron_h_8b_training_flops_by_hand(s):
    c = PRESETS["nemotron-h-8b"]
    h, V, f, a, kv, d = c.hidden, c.padded_vocab, c.ffn_hidden, c.heads, c.groups, c.head_size
    Q, N, P, H, G = c.chunk_size, c.ssm_state, c.ssm_head_dim, c.ssm_heads, c.ssm_groups
    mamba = 3 * projections(c) + 3 * ssd_forward_matmuls(c) + 2 * Q * N * G + 2 * N * P * H
    # attention (flash, full causal scores counted): QKV and output projection 3×, Q·Kᵀ and P·V
    # 2·2·a·d per key forward, five such matmuls backward
    attention = 3 * (2 * h * (a + 2 * kv) * d + 2 * a * d * h) + 7 * 2 * a * d * s
    mlp = 3 * 2 * 2 * h * f  # up and down, squared ReLU between
    per_token = 24 * mamba + 4 * attention + 24 * mlp + 3 * 2 * h * V
    assert training_flops(build(c), b=1, s=s) == s * per_token
