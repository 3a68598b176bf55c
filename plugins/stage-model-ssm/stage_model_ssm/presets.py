"""Named configurations, with the shapes of each model's public config (sources in the README)."""

from __future__ import annotations

from types import MappingProxyType

from .config import HybridConfig

#: nvidia/Nemotron-H-8B-Base-8K's hybrid_override_pattern: 24 Mamba-2, 24 MLP and 4 attention layers
NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"

PRESETS = MappingProxyType({
    c.name: c
    for c in (
        # small models for tests and quick runs
        HybridConfig(name="mamba2-tiny", family="mamba2", pattern="MMMM", tie_embeddings=True, ssm_groups=1),
        HybridConfig(name="hybrid-tiny", family="nemotron_h", pattern="M*-EM*-E", max_positions=1024,
                     router_score="sigmoid"),
        # state-spaces/mamba2-2.7b: d_model 2560, 64 layers, headdim 64, expand 2 (80 heads),
        # d_state 128, 1 group, d_conv 4, chunk 256, vocabulary 50277 padded to a multiple of 16,
        # tied embeddings; trained on 2048-token sequences (Dao & Gu 2024)
        HybridConfig(name="mamba2-2.7b", family="mamba2", pattern="M" * 64, hidden=2560, vocab_size=50277,
                     vocab_pad_to=16, ssm_heads=80, ssm_head_dim=64, ssm_groups=1, ssm_state=128, conv_kernel=4,
                     chunk_size=256, seq_len=2048, tie_embeddings=True),
        # nvidia/Nemotron-H-8B-Base-8K: hidden 4096, 52 layers, Mamba-2 128 heads of 64 in 8 groups,
        # state 128, conv 4, chunk 128; attention 32 heads, 8 KV heads of 128, no RoPE; squared-ReLU
        # MLPs of 21504; vocabulary 131072, untied; 8192-token context
        HybridConfig(name="nemotron-h-8b", family="nemotron_h", pattern=NEMOTRON_H_8B_PATTERN, hidden=4096,
                     vocab_size=131072, ssm_heads=128, ssm_head_dim=64, ssm_groups=8, ssm_state=128,
                     conv_kernel=4, chunk_size=128, heads=32, kv_heads=8, head_dim=128, rope=False,
                     ffn_hidden=21504, mlp_act="relu2", max_positions=8192, seq_len=8192),
    )
})


def family_presets(family: str):
    return MappingProxyType({name: c for name, c in PRESETS.items() if c.family == family})
