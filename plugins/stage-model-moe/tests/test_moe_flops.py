"""FLOPs of the MoE graphs against the published formula and hand derivations.

Oracle (REFERENCE.md §1, Megatron-LM ``num_floating_point_operations``, GQA + SwiGLU + MoE):
    12·B·s·L·h²·[(1 + g/a + s/h)·(a·d/h) + (f/h)·k·(3/2) + V/(2·L·h)]
with f the per-expert width.  It counts matmuls only, forward + backward (= 3× forward),
no recompute, the full s×s score matrix.  The router matmul [h, E] is not in it: we add
its 3·2·B·s·L·h·E by hand and show it is exactly the difference.
"""

from __future__ import annotations

import pytest
import sympy as sp
from stage_core.api import differentiate, param_counts, step_values, sym, total

from stage_model_moe import PRESETS, build

S = 4096  # a training sequence; one sequence per step (B = 1)


def formula(c, B=1, s=S):
    L, h, a, g, d = c.layers, c.hidden, c.heads, c.kv_heads, c.head_size
    f, k, V = c.expert_ffn_hidden, c.experts_per_token, c.padded_vocab
    return sp.Rational(12 * B * s * L * h * h) * (
        (1 + sp.Rational(g, a) + sp.Rational(s, h)) * sp.Rational(a * d, h)
        + sp.Rational(f, h) * k * sp.Rational(3, 2)
        + sp.Rational(V, 2 * L * h)
    )


def router_flops(c, B=1, s=S):
    return 3 * 2 * B * s * c.layers * c.hidden * c.experts


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "mixtral-8x22b"])
def test_mixtral_matmul_flops_match_megatron_formula(preset):
    c = PRESETS[preset].replace(attention="classic")
    tg = differentiate(build(c))
    mm = total(tg, "matmul_flops", step_values(tg, b=1, s=S))
    oracle = formula(c)
    assert mm == pytest.approx(oracle + router_flops(c), rel=0.01)
    # exactly: the formula plus the router's matmul (dropless routing, full s×s scores)
    assert mm - oracle == router_flops(c)


def test_mixtral_8x7b_numbers():
    # the figures the report quotes: one 4096-token sequence, classic attention
    c = PRESETS["mixtral-8x7b"].replace(attention="classic")
    tg = differentiate(build(c))
    assert total(tg, "matmul_flops", step_values(tg, b=1, s=S)) == 339_697_553_375_232
    assert formula(c) == 339_671_783_571_456
    assert router_flops(c) == 25_769_803_776


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "mixtral-8x22b"])
def test_flash_attention_adds_its_recomputed_scores(preset):
    # FlashAttention's backward recomputes Q·Kᵀ: 2·B·s²·a·d per layer more than the formula
    c = PRESETS[preset]
    flash = differentiate(build(c))
    classic = differentiate(build(c.replace(attention="classic")))
    values = step_values(flash, b=1, s=S)
    extra = total(flash, "matmul_flops", values) - total(classic, "matmul_flops", values)
    assert extra == 2 * S * S * c.heads * c.head_size * c.layers


def test_causal_flops_halve_the_score_matmuls():
    c = PRESETS["mixtral-8x7b"].replace(attention="classic")
    full = differentiate(build(c))
    half = differentiate(build(c.replace(causal_flops=True)))
    values = step_values(full, b=1, s=S)
    saved = total(full, "matmul_flops", values) - total(half, "matmul_flops", values)
    # scores and context: 4·s²·a·d per layer forward, 3× with backward, half of it skipped
    assert saved == 3 * 4 * S * S * c.heads * c.head_size * c.layers // 2


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3", "moe-mla-tiny"])
def test_backward_of_every_einsum_is_twice_its_forward(preset):
    tg = differentiate(build(PRESETS[preset]))
    bwd: dict = {}
    for op in tg.backward_ops:
        if op.kind == "einsum" and op.forward_op is not None:
            bwd.setdefault(op.forward_op, []).append(op)
    einsums = [op for op in tg.forward_ops if op.kind == "einsum"]
    assert einsums and set(bwd) == set(einsums)
    for op in einsums:
        assert sp.expand(sum(o.flops for o in bwd[op]) - 2 * op.flops) == 0, op.name


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"])
def test_forward_matmuls_are_two_flops_per_active_weight_per_token(preset):
    # Outside the attention core every matmul multiplies a token by a weight once, and a
    # routed token meets k of the E experts: forward matmul FLOPs = 2 · tokens · (active
    # weights that are matmul operands: all but the embedding table and the norm gains).
    c = PRESETS[preset]
    g = build(c)
    values = step_values(g, b=2, s=S)
    tokens = 2 * S
    fwd = total(g, "matmul_flops", values, [op for op in g.ops if op.block != "attn_core"])
    _, active = param_counts(g)
    not_matmul = c.padded_vocab * c.hidden + sum(
        values_of(p, values) for p in g.params if len(p.shape) == 1 and not p.name.endswith("shared_gate.weight"))
    assert fwd == 2 * tokens * (active - not_matmul)


def values_of(p, values):
    return sym.evaluate(p.numel, values)


def test_capacity_factor_scales_the_expert_matmuls():
    c = PRESETS["mixtral-8x7b"]
    values = step_values(build(c), b=1, s=S)
    dropless = build(c)
    padded = build(c.replace(capacity_factor=1.25))
    experts = lambda g: total(g, "matmul_flops", values, [op for op in g.ops if ".experts." in op.name])  # noqa: E731
    # 3 expert matmuls of 2·(tokens·k·cf)·h·fe per MoE layer
    assert experts(dropless) == c.layers * 3 * 2 * S * 2 * c.hidden * c.expert_ffn_hidden
    assert experts(padded) * 4 == experts(dropless) * 5


def test_moe_kernels_count_their_work():
    c = PRESETS["deepseek-v3"]
    g = build(c)
    values = step_values(g, b=1, s=S)
    by_name = {op.name: op for op in g.ops}
    router = by_name["layers.3.moe.router"]
    dispatch = by_name["layers.3.moe.dispatch"]
    combine = by_name["layers.3.moe.combine"]
    E, k, h = c.experts, c.experts_per_token, c.hidden
    # sigmoid 3 + top-k 1 + selection bias 1 per score; renormalise 2 and scale 1 per kept weight
    assert sym.evaluate(router.flops, values) == S * E * 5 + S * k * 3
    assert sym.evaluate(dispatch.flops, values) == 0
    # the k rows read and written (bf16) and k int32 indices per token
    assert sym.evaluate(dispatch.bytes, values) == S * k * h * 2 * 2 + S * k * 4
    assert sym.evaluate(combine.flops, values) == 2 * S * k * h
    # the expert slots: c = b·s·k/E rows per expert
    assert sym.evaluate(dispatch.outputs[0].shape[1], values) == S * k // E
