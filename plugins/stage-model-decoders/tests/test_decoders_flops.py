"""FLOPs of local attention, soft-capping and whole training steps, counted by hand."""

from __future__ import annotations

import pytest
from stage_core.api import differentiate, evaluate_sum, step_values, training_flops

from stage_model_decoders import PRESETS, build


def layer_core(graph, layer: int, what: str = "matmul_flops", phase: str = "forward", s: int | None = None) -> int:
    tg = differentiate(graph) if phase != "forward" else graph
    ops = [op for op in tg.ops if op.layer == layer and op.block == "attn_core" and op.phase == phase]
    return evaluate_sum([getattr(op, what) for op in ops], step_values(graph, 1, s))


def test_gemma2_2b_local_layer_by_hand():
    # Gemma 2 2B at s = 8192: layer 0 is local (window 4096), layer 1 global.  Per query
    # head and query, Q·Kᵀ and P·V each cost 2·d FLOPs per key read: 2 · 2·d · keys.
    # Local: 2 matmuls · 8 heads · 8192 queries · 4096 keys · 2·256 = 274,877,906,944
    g = build(PRESETS["gemma2-2b"])
    local = 2 * 8 * 8192 * 4096 * 2 * 256
    assert local == 274_877_906_944
    assert layer_core(g, 0) == local
    assert layer_core(g, 1) == 2 * local  # the global layer reads all 8192 keys
    # softmax (7) and the soft-cap (3) per score, over the window
    assert layer_core(g, 0, "other_flops") == (7 + 3) * 8 * 8192 * 4096
    # backward: five matmuls over the same window (the recomputed scores among them)
    assert layer_core(g, 0, phase="backward") == 5 * local // 2


def test_window_longer_than_the_sequence_is_full_attention():
    g = build(PRESETS["gemma2-2b"])
    assert layer_core(g, 0, s=2048) == layer_core(g, 1, s=2048) == 2 * 8 * 2048 * 2048 * 2 * 256


def training_matmuls_by_hand(c, s: int) -> int:
    """Matmul FLOPs of one sequence through forward and backward (flash attention).

    Per token and layer: QKV 2·h·(a+2g)·d, output projection 2·a·d·h, gated MLP 3·2·h·f,
    each 3× in training (forward, data and weight gradients); attention 2·2·a·d per key
    read forward and 5·2·a·d backward; the head 2·h·V, 3×.
    """
    h, a, g, d, f, V, L = c.hidden, c.heads, c.groups, c.head_size, c.ffn_hidden, c.padded_vocab, c.layers
    dense = 3 * (2 * h * (a + 2 * g) * d + 2 * a * d * h + 6 * h * f) * s * L + 3 * 2 * h * V * s
    keys = sum(min(c.sliding_window, s) if c.is_local(i) else s for i in range(L))
    return dense + 7 * 2 * a * d * s * keys


@pytest.mark.parametrize("name", ["gemma2-2b", "gemma2-27b", "gemma3-1b", "gemma3-27b", "phi3-mini", "phi4",
                                  "olmo2-7b"])
def test_training_matmuls_against_the_hand_count(name):
    c = PRESETS[name]
    assert training_flops(build(c), b=1) == training_matmuls_by_hand(c, c.seq_len)


def test_final_logit_softcap_other_flops():
    c = PRESETS["gemma2-2b"]
    s, V = c.seq_len, c.padded_vocab
    capped = training_flops(build(c), what="other_flops")
    plain = training_flops(build(c.replace(final_softcap=None)), what="other_flops")
    assert capped - plain == (3 + 4) * s * V  # forward 3, backward 4 per logit
