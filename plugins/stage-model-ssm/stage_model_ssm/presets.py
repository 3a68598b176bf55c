"""Named configurations, with the shapes of each model's public config (sources in the README)."""

from __future__ import annotations

from types import MappingProxyType

from .config import HybridConfig

#: nvidia/Nemotron-H-8B-Base-8K's hybrid_override_pattern: 24 Mamba-2, 24 MLP and 4 attention layers
NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"

#: ai21labs/Jamba-v0.1's 32 layers, two characters each: the mixer (attention at i % 8 == 4,
#: else Mamba-1) and the FFN (MoE at odd i, else MLP)
JAMBA_PATTERN = "".join(("*" if i % 8 == 4 else "M") + ("E" if i % 2 == 1 else "-") for i in range(32))


def zamba2_pattern(hybrid: tuple[int, ...], layers: int) -> str:
    """A Zamba2 layer list: ``H`` (hybrid) at ``hybrid``, else ``M`` (Mamba)."""
    return "".join("H" if i in hybrid else "M" for i in range(layers))


#: Zyphra/Zamba2-1.2B's layers_block_type: 38 layers, hybrid at 5, 11, ..., 35 (every 6th)
ZAMBA2_1_2B_PATTERN = zamba2_pattern(tuple(range(5, 38, 6)), 38)
#: Zyphra/Zamba2-2.7B's: 54 layers, hybrid_layer_ids 6, 12, 18, 24, 30, 36, 42, 47, 51
ZAMBA2_2_7B_PATTERN = zamba2_pattern((6, 12, 18, 24, 30, 36, 42, 47, 51), 54)
#: Zyphra/Zamba2-7B's: 81 layers, hybrid at 6, 11, 17, 23, ..., 77 (13 uses)
ZAMBA2_7B_PATTERN = zamba2_pattern((6, *range(11, 81, 6)), 81)

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
        # Mamba-1: a small one, and tiiuae/falcon-mamba-7b (d_model 4096, 64 layers, d_inner 8192,
        # state 16, conv 4, Δ rank 256, vocabulary 65024, untied; trained up to 8192 tokens)
        HybridConfig(name="mamba1-tiny", family="mamba", pattern="MMMM", ssm_version=1, ssm_channels=256,
                     dt_rank=8, tie_embeddings=True),
        HybridConfig(name="falcon-mamba-7b", family="mamba", pattern="M" * 64, hidden=4096, vocab_size=65024,
                     ssm_version=1, ssm_channels=8192, ssm_state=16, conv_kernel=4, dt_rank=256, seq_len=8192),
        # Jamba: a small one of 8 layers, and ai21labs/Jamba-v0.1 (32 layers: attention at i % 8 == 4,
        # MoE of 16 experts, top-2, at odd i; Mamba-1 d_inner 8192, state 16, Δ rank 256; 32 heads,
        # 8 KV heads, no positions; MLP 14336; vocabulary 65536)
        HybridConfig(name="jamba-tiny", family="jamba", pattern="M-MEM-ME*-MEM-ME", blocks_per_layer=2,
                     ssm_version=1, ssm_channels=256, dt_rank=8, ssm_dt_norm=True, mlp_act="swiglu",
                     expert_ffn_hidden=256, router_score="softmax", max_positions=1024),
        HybridConfig(name="jamba-v0.1", family="jamba", pattern=JAMBA_PATTERN, blocks_per_layer=2, hidden=4096,
                     vocab_size=65536, ssm_version=1, ssm_channels=8192, ssm_state=16, conv_kernel=4, dt_rank=256,
                     ssm_dt_norm=True, heads=32, kv_heads=8, ffn_hidden=14336, mlp_act="swiglu", experts=16,
                     experts_per_token=2, expert_ffn_hidden=14336, max_positions=262144, seq_len=8192),
        # Zamba2: a small one (two shared blocks used in turn, both adapters), and Zyphra's
        # 1.2B, 2.7B and 7B: Mamba-2 with head dim 64, expand 2, conv 4, chunk 256; shared
        # blocks of 32 heads over 2·hidden (head dim 2h/32), GeGLU MLPs of 4·hidden, LoRA
        # adapters of rank 128 on the MLPs (and on q, k, v in the 1.2B); RoPE; vocabulary
        # 32000, tied; 4096-token context
        HybridConfig(name="zamba2-tiny", family="zamba2", pattern="MMHMHMH", ssm_heads=8, ssm_head_dim=32,
                     ssm_groups=2, ssm_state=16, heads=4, kv_heads=4, head_dim=64, ffn_hidden=256, shared_blocks=2,
                     shared_attn_adapter=True, adapter_rank=8, rope=True, tie_embeddings=True, max_positions=1024),
        HybridConfig(name="zamba2-1.2b", family="zamba2", pattern=ZAMBA2_1_2B_PATTERN, hidden=2048, vocab_size=32000,
                     ssm_heads=64, ssm_head_dim=64, ssm_groups=1, ssm_state=128, conv_kernel=4, chunk_size=256,
                     heads=32, kv_heads=32, head_dim=128, ffn_hidden=8192, shared_blocks=1, shared_attn_adapter=True,
                     adapter_rank=128, rope=True, tie_embeddings=True, max_positions=4096, seq_len=4096),
        HybridConfig(name="zamba2-2.7b", family="zamba2", pattern=ZAMBA2_2_7B_PATTERN, hidden=2560, vocab_size=32000,
                     ssm_heads=80, ssm_head_dim=64, ssm_groups=1, ssm_state=64, conv_kernel=4, chunk_size=256,
                     heads=32, kv_heads=32, head_dim=160, ffn_hidden=10240, shared_blocks=2, adapter_rank=128,
                     rope=True, tie_embeddings=True, max_positions=4096, seq_len=4096),
        HybridConfig(name="zamba2-7b", family="zamba2", pattern=ZAMBA2_7B_PATTERN, hidden=3584, vocab_size=32000,
                     ssm_heads=112, ssm_head_dim=64, ssm_groups=2, ssm_state=64, conv_kernel=4, chunk_size=256,
                     heads=32, kv_heads=32, head_dim=224, ffn_hidden=14336, shared_blocks=2, adapter_rank=128,
                     rope=True, tie_embeddings=True, max_positions=4096, seq_len=4096),
    )
})


def family_presets(family: str):
    return MappingProxyType({name: c for name, c in PRESETS.items() if c.family == family})
