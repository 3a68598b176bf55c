"""Parameter counts against published totals, with the source of each."""

from __future__ import annotations

import pytest
from stage_core.api import param_counts

from stage_model_decoders import PRESETS, build

#: Hugging Face Hub ``safetensors.total`` of each model's repository (exact element counts)
HF_TOTAL = {
    "gemma2-2b": 2_614_341_888,  # google/gemma-2-2b
    "gemma2-9b": 9_241_705_984,  # google/gemma-2-9b
    "gemma2-27b": 27_227_128_320,  # google/gemma-2-27b
    "gemma3-1b": 999_885_952,  # google/gemma-3-1b-pt (text only)
    "phi3-mini": 3_821_079_552,  # microsoft/Phi-3-mini-4k-instruct
    "phi3-medium": 13_960_238_080,  # microsoft/Phi-3-medium-4k-instruct
    "phi4": 14_659_507_200,  # microsoft/phi-4
    "olmo2-7b": 7_298_617_344,  # allenai/OLMo-2-1124-7B
    "olmo2-13b": 13_716_198_400,  # allenai/OLMo-2-1124-13B
}

#: Gemma 3 Technical Report (arXiv 2503.19786), Table 1: embedding and non-embedding
#: parameters of the language model (the 4B-27B checkpoints also hold a 417M vision encoder)
GEMMA3_TABLE1 = {
    "gemma3-1b": (302e6, 698e6),
    "gemma3-4b": (675e6, 3_209e6),
    "gemma3-12b": (1_012e6, 10_759e6),
    "gemma3-27b": (1_416e6, 25_600e6),
}


def total(config) -> int:
    return param_counts(build(config))[0]


@pytest.mark.parametrize("name", sorted(HF_TOTAL))
def test_exact_hub_counts(name):
    assert total(PRESETS[name]) == HF_TOTAL[name]


@pytest.mark.parametrize("name", sorted(GEMMA3_TABLE1))
def test_gemma3_text_decoders_against_the_technical_report(name):
    c = PRESETS[name]
    embedding, non_embedding = GEMMA3_TABLE1[name]
    n = total(c)
    assert abs(n - (embedding + non_embedding)) <= 0.005 * (embedding + non_embedding)
    # the table's non-embedding column, to its 1M rounding
    assert abs((n - c.padded_vocab * c.hidden) - non_embedding) <= 0.5e6


def test_count_by_hand_gemma2_2b():
    # tied embedding V·h; per layer q and o a·d·h each, k and v g·d·h each, GeGLU 3·h·f,
    # four norms (pre and post, attention and MLP) h each; final norm h
    V, h, L, a, g, d, f = 256000, 2304, 26, 8, 4, 256, 9216
    assert total(PRESETS["gemma2-2b"]) == V * h + L * (2 * a * d * h + 2 * g * d * h + 3 * h * f + 4 * h) + h


def test_count_by_hand_olmo2_7b():
    # untied embeddings 2·V·h; per layer 4·h² attention, 3·h·f MLP, two post-norms h each and
    # q/k norms over all heads (a·d and g·d values); final norm h
    V, h, L, f = 100352, 4096, 32, 11008
    assert total(PRESETS["olmo2-7b"]) == 2 * V * h + L * (4 * h * h + 3 * h * f + 2 * h + 2 * h) + h


def test_vocabulary_as_stored_unless_padded():
    c = PRESETS["phi3-mini"]
    assert c.padded_vocab == 32064  # not a multiple of 128: Phi-3 stores it as is
    assert total(c.replace(vocab_pad_to=128)) - total(c) == 2 * (32128 - 32064) * c.hidden
