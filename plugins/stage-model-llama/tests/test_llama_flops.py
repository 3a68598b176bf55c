"""Matmul FLOPs of a training step against Megatron-LM's generalised formula.

Megatron-LM's ``num_floating_point_operations`` (GQA, SwiGLU, dense so k = 1):
12·B·s·L·h²·[(1 + g/a + s/h)·(a·d/h) + (f/h)·(3/2) + V/(2·L·h)], matmuls only, the full
s×s score matrix counted.  The graph is differentiated by the core and evaluated at
b = 1; a step of B sequences is B times that.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from stage_core.api import BACKWARD, FORWARD, differentiate, evaluate_sum, step_values, training_flops

from stage_model_llama import PRESETS, LlamaConfig, build

B = 1024


def generalised(c, B: int) -> Fraction:
    s, L, h, a, g, d, f, V = (c.seq_len, c.layers, c.hidden, c.heads, c.groups, c.head_size, c.ffn_hidden,
                              c.padded_vocab)
    bracket = ((1 + Fraction(g, a) + Fraction(s, h)) * Fraction(a * d, h) + Fraction(f, h) * Fraction(3, 2)
               + Fraction(V, 2 * L * h))
    return 12 * B * s * L * h * h * bracket


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_classic_attention_matches_the_formula(name):
    c = PRESETS[name].replace(attention="classic")
    ours = B * training_flops(build(c), b=1)
    oracle = generalised(c, B)
    assert abs(ours - oracle) <= 0.01 * oracle
    assert ours == oracle


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_flash_attention_adds_the_recomputed_scores(name):
    # FlashAttention's backward recomputes Q·Kᵀ: 2·b·s²·a·d more per layer
    c = PRESETS[name]
    assert c.attention == "flash"
    ours = B * training_flops(build(c), b=1)
    assert ours == generalised(c, B) + 2 * B * c.seq_len**2 * c.heads * c.head_size * c.layers


def test_head_dim_that_differs_from_hidden_over_heads():
    # as in Mistral-Nemo: h 5120, 32 heads of 128 (a·d = 4096 ≠ h)
    c = LlamaConfig(layers=2, hidden=5120, heads=32, kv_heads=8, head_dim=128, ffn_hidden=14336,
                    vocab_size=131072, max_positions=4096, seq_len=1024, attention="classic")
    assert training_flops(build(c), b=1) == generalised(c, 1)


def test_causal_flops_halve_the_attention_matmuls():
    c = PRESETS["llama3-8b"].replace(attention="classic", causal_flops=True)
    s, a, d, L = c.seq_len, c.heads, c.head_size, c.layers
    # attention core: 2 matmuls of 2·s²·a·d forward, twice backward: 12·s²·a·d, halved
    assert training_flops(build(c), b=1) == generalised(c, 1) - 6 * s * s * a * d * L


def test_every_einsum_has_its_backward_at_twice_the_forward():
    c = PRESETS["qwen2.5-7b"].replace(attention="classic")
    tg = differentiate(build(c))
    values = step_values(tg)
    einsums = [op for op in tg.forward_ops if op.kind == "einsum"]
    assert len(einsums) == 7 * c.layers + 1  # qkv, scores, context, proj, gate, up, down; head
    backward: dict = {}
    for op in tg.backward_ops:
        if op.forward_op is not None and op.forward_op.kind == "einsum":
            backward.setdefault(op.forward_op, []).append(op)
    for op in einsums:
        fwd = evaluate_sum([op.matmul_flops], values)
        bwd = evaluate_sum([o.matmul_flops for o in backward[op]], values)
        assert fwd > 0 and bwd == 2 * fwd, op.name


def test_other_flops_are_reported_separately():
    g = build(PRESETS["llama3-8b"])
    assert training_flops(g, what="other_flops", phase=FORWARD) > 0
    assert training_flops(g, what="other_flops", phase=BACKWARD) > 0
    total = training_flops(g, what="flops")
    assert total == training_flops(g) + training_flops(g, what="other_flops") > training_flops(g)


def test_embedding_is_a_lookup_and_its_gradient_a_scatter_add():
    c = PRESETS["llama3-8b"]
    tg = differentiate(build(c))
    values = step_values(tg)
    (emb,) = [op for op in tg.forward_ops if op.kind == "embedding"]
    assert evaluate_sum([emb.flops], values) == 0  # no positions table: nothing but a gather
    (scatter,) = [op for op in tg.backward_ops if op.forward_op is emb and op.fn == "scatter_add"]
    assert scatter.kind == "embedding"
    assert scatter.outputs[0].grad_of is emb.inputs[1]
    assert evaluate_sum([scatter.matmul_flops], values) == 0


def test_mistral_window_counts_its_keys_not_the_sequence():
    # Mistral 7B at 8192 tokens, window 4096: per layer and query, Q·Kᵀ and P·V read 4096 keys,
    # 2·2·a·d FLOPs per key (32 heads of 128): 2·2·8192·32·128·4096 forward, half of full attention
    c = PRESETS["mistral-7b"].replace(max_positions=32768)
    g = build(c)
    core = [op for op in g.ops if op.layer == 0 and op.block == "attn_core"]
    at = lambda s: evaluate_sum([op.matmul_flops for op in core], step_values(g, 1, s))  # noqa: E731
    assert at(8192) == 2 * 2 * 8192 * 32 * 128 * 4096 == at(4096) * 2
    full = build(c.replace(sliding_window=None))
    full_core = [op for op in full.ops if op.layer == 0 and op.block == "attn_core"]
    assert evaluate_sum([op.matmul_flops for op in full_core], step_values(full, 1, 8192)) == 2 * at(8192)
