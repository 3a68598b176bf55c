"""Named LLaMA-family configurations, from each model's public config.json (sources in the README).

``seq_len`` is the pre-training sequence length the model's authors report (Llama 2
4096, Llama 3 8192, Qwen2.5 4096 before long-context extension); Mistral 7B (v0.1) has a
4096-token sliding window in every layer and uses 4096.
"""

from __future__ import annotations

from types import MappingProxyType

from .config import LlamaConfig


def _c(name, layers, hidden, heads, kv_heads, ffn, vocab, positions, seq_len, **extra) -> LlamaConfig:
    return LlamaConfig(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn,
                       vocab_size=vocab, max_positions=positions, seq_len=seq_len, **extra)


PRESETS = MappingProxyType({
    c.name: c
    for c in (
        _c("llama-tiny", 2, 128, 4, 2, 352, 512, 256, 256),
        _c("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 4096),
        _c("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 4096),
        _c("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 4096),
        _c("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 8192),
        _c("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 8192),
        _c("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 131072, 8192),  # Llama 3.1
        _c("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, 4096, sliding_window=4096),
        _c("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 131072, 4096, qkv_bias=True),
        _c("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, 131072, 4096, qkv_bias=True),
    )
})
