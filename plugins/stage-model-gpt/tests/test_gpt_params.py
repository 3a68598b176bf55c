"""Parameter counts against published totals."""

from __future__ import annotations

from fractions import Fraction

import pytest
from stage_core.api import param_counts

from stage_model_gpt import PRESETS, build
from stage_model_gpt.presets import MEGATRON_TABLE1

#: Hugging Face transformers' GPT2LMHeadModel.num_parameters() (tied head; vocabulary 50257)
HF_GPT2 = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
}


def total(config) -> int:
    return param_counts(build(config))[0]


@pytest.mark.parametrize("name", sorted(HF_GPT2))
def test_gpt2_exact_without_padding(name):
    assert total(PRESETS[name].replace(vocab_pad_to=1)) == HF_GPT2[name]


@pytest.mark.parametrize("name", sorted(HF_GPT2))
def test_gpt2_padding_adds_rows_of_the_table(name):
    c = PRESETS[name]
    assert c.padded_vocab == 50304  # 50257 up to a multiple of 128
    assert total(c) == HF_GPT2[name] + (50304 - 50257) * c.hidden


def test_gpt3_175b():
    c = PRESETS["gpt3-175b"]
    assert c.padded_vocab == 51200
    n = total(c)
    assert abs(n - 175e9) <= 0.005 * 175e9
    # Narayanan et al. 2021, Table 2 lists this model (V 51200) as 174.6B
    assert round(n / 1e9, 1) == 174.6


def megatron_formula(L, h, V, s) -> Fraction:
    """Narayanan et al. 2021, Eq. 2: 12·L·h²·(1 + 13/(12h) + (V+s)/(12·L·h))."""
    return 12 * L * h * h * (1 + Fraction(13, 12 * h) + Fraction(V + s, 12 * L * h))


@pytest.mark.parametrize("name", sorted(MEGATRON_TABLE1))
def test_megatron_scaling_models(name):
    heads, hidden, layers, published_billions = MEGATRON_TABLE1[name]
    c = PRESETS[name]
    assert (c.heads, c.hidden, c.layers, c.padded_vocab, c.max_positions) == (heads, hidden, layers, 51200, 2048)
    n = total(c)
    # Eq. 2 counts 13h per layer for biases and layer norms, not the final layer norm (2h)
    assert n == megatron_formula(layers, hidden, 51200, 2048) + 2 * hidden
    assert abs(n / 1e9 - published_billions) < 0.05  # Table 1 rounds to 0.1B
    assert abs(n - megatron_formula(layers, hidden, 51200, 2048)) <= 0.005 * n


def test_reference_checks_of_the_formula():
    # REFERENCE §1: h 2304, L 24 gives 1.7B; h 4096, L 36 gives 7.5B
    assert round(megatron_formula(24, 2304, 51200, 2048) / 10**9, 1) == Fraction(17, 10)
    assert round(megatron_formula(36, 4096, 51200, 2048) / 10**9, 1) == Fraction(75, 10)


def test_untied_head_adds_a_table():
    c = PRESETS["gpt2"]
    assert total(c.replace(tie_embeddings=False)) == total(c) + c.padded_vocab * c.hidden


def test_ffn_width_default_and_override():
    c = PRESETS["gpt-tiny"]
    assert c.ffn == 4 * c.hidden
    wider = c.replace(ffn_hidden=1000)
    # fc1 [h, f] + bias [f] + fc2 [f, h] per layer
    assert total(wider) - total(c) == c.layers * (2 * c.hidden + 1) * (1000 - 4 * c.hidden)
