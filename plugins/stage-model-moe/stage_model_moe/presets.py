"""Named presets, with the shapes of the public Hugging Face ``config.json`` files.

Sources (see the README for the full list and what was cross-checked):

* mixtral-8x7b: mistralai/Mixtral-8x7B-v0.1 config.json (hidden 4096, 32 layers, 32 heads,
  8 KV heads, intermediate 14336, vocab 32000, 8 experts, top-2, rope_theta 1e6).
* mixtral-8x22b: mistralai/Mixtral-8x22B-v0.1 / -Instruct-v0.1 config.json (hidden 6144,
  56 layers, 48 heads, 8 KV heads, intermediate 16384, vocab 32768, 8 experts, top-2,
  65536 positions).
* qwen3-235b-a22b: Qwen/Qwen3-235B-A22B config.json (hidden 4096, 94 layers, 64 heads,
  4 KV heads, head_dim 128, intermediate 12288, moe_intermediate 1536, 128 experts, top-8,
  vocab 151936, q/k RMSNorm, no shared experts).
* deepseek-v3: deepseek-ai/DeepSeek-V3 config.json (hidden 7168, 61 layers of which the
  first 3 dense with intermediate 18432, 128 heads with MLA q_lora 1536, kv_lora 512,
  qk_nope 128, qk_rope 64, v_head 128; 256 routed experts of width 2048 + 1 shared,
  top-8, sigmoid scores with noaux_tc bias, routed_scaling_factor 2.5, vocab 129280).
"""

from __future__ import annotations

from .config import MoEConfig

PRESETS: dict[str, MoEConfig] = {
    # small models for tests and quick runs: Mixtral-like, and DeepSeek-like (MLA, a
    # dense first layer, a shared expert, sigmoid routing)
    "moe-tiny": MoEConfig(name="moe-tiny", seq_len=256, max_positions=256),
    "moe-mla-tiny": MoEConfig(
        name="moe-mla-tiny", arch="deepseek_v3", layers=3, hidden=128, heads=4, kv_heads=4, ffn_hidden=256,
        vocab_size=512, experts=8, experts_per_token=2, expert_ffn_hidden=64, shared_expert_ffn_hidden=64,
        first_dense_layers=1, router_score="sigmoid", routed_scaling_factor=2.5, router_selection_bias=True,
        expert_groups=4, topk_groups=2, attention_type="mla", q_lora_rank=64, kv_lora_rank=32,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, seq_len=256, max_positions=256, mtp_layers=1,
    ),
    "mixtral-8x7b": MoEConfig(
        name="mixtral-8x7b", arch="mixtral",
        layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab_size=32000,
        experts=8, experts_per_token=2, expert_ffn_hidden=14336, norm_topk_prob=True,
        max_positions=32768, rope_theta=1000000.0, norm_eps=1e-5,
    ),
    "mixtral-8x22b": MoEConfig(
        name="mixtral-8x22b", arch="mixtral",
        layers=56, hidden=6144, heads=48, kv_heads=8, ffn_hidden=16384, vocab_size=32768,
        experts=8, experts_per_token=2, expert_ffn_hidden=16384, norm_topk_prob=True,
        max_positions=65536, rope_theta=1000000.0, norm_eps=1e-5,
    ),
    "qwen3-235b-a22b": MoEConfig(
        name="qwen3-235b-a22b", arch="qwen3_moe",
        layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, ffn_hidden=12288, vocab_size=151936,
        experts=128, experts_per_token=8, expert_ffn_hidden=1536, norm_topk_prob=True, qk_norm=True,
        max_positions=40960, rope_theta=1000000.0, norm_eps=1e-6,
    ),
    "deepseek-v3": MoEConfig(
        name="deepseek-v3", arch="deepseek_v3",
        layers=61, hidden=7168, heads=128, kv_heads=128, ffn_hidden=18432, vocab_size=129280,
        experts=256, experts_per_token=8, expert_ffn_hidden=2048, shared_expert_ffn_hidden=2048,
        first_dense_layers=3, router_score="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5,
        router_selection_bias=True, expert_groups=8, topk_groups=4,
        attention_type="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, max_positions=163840, rope_theta=10000.0, norm_eps=1e-6, mtp_layers=1,
    ),
}
