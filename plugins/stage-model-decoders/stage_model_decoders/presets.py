"""Named configurations, with the shapes of each model's public ``config.json`` (sources in the README).

``seq_len`` is the pre-training sequence length the authors report: Gemma 2 8192,
Gemma 3 32768 (before the 4B-27B models' rope extension to 128K), Phi-3 4096, Phi-4
4096 (extended to 16K in mid-training), OLMo 2 4096.  Vocabularies are as the
checkpoints store them (no padding: ``vocab_pad_to`` 1).
"""

from __future__ import annotations

from types import MappingProxyType

from .config import DecoderConfig

GEMMA = dict(norm_placement="sandwich", mlp_act="geglu", embed_scale=True, tie_embeddings=True)
GEMMA2 = dict(GEMMA, family="gemma2", vocab_size=256000, max_positions=8192, seq_len=8192, sliding_window=4096,
              global_every=2, attn_softcap=50.0, final_softcap=30.0)
GEMMA3 = dict(GEMMA, family="gemma3", qk_norm="head", global_every=6, seq_len=32768)
PHI3 = dict(family="phi3", norm_placement="pre", mlp_act="swiglu")
OLMO2 = dict(family="olmo2", norm_placement="post", mlp_act="swiglu", qk_norm="all", vocab_size=100352,
             max_positions=4096, seq_len=4096)


def _c(name, layers, hidden, heads, kv_heads, head_dim, ffn, family: dict, **extra) -> DecoderConfig:
    return DecoderConfig(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                         ffn_hidden=ffn, **{**family, **extra})


PRESETS = MappingProxyType({
    c.name: c
    for c in (
        # a small Gemma-2-like model for quick runs: local layers of a 64-token window
        _c("gemma-tiny", 4, 128, 4, 2, 64, 256, GEMMA2, vocab_size=512, max_positions=512, seq_len=256,
           sliding_window=64),
        _c("gemma2-2b", 26, 2304, 8, 4, 256, 9216, GEMMA2),
        _c("gemma2-9b", 42, 3584, 16, 8, 256, 14336, GEMMA2),
        _c("gemma2-27b", 46, 4608, 32, 16, 128, 36864, GEMMA2),
        _c("gemma3-1b", 26, 1152, 4, 1, 256, 6912, GEMMA3, vocab_size=262144, max_positions=32768,
           sliding_window=512),
        _c("gemma3-4b", 34, 2560, 8, 4, 256, 10240, GEMMA3, vocab_size=262208, max_positions=131072,
           sliding_window=1024),
        _c("gemma3-12b", 48, 3840, 16, 8, 256, 15360, GEMMA3, vocab_size=262208, max_positions=131072,
           sliding_window=1024),
        _c("gemma3-27b", 62, 5376, 32, 16, 128, 21504, GEMMA3, vocab_size=262208, max_positions=131072,
           sliding_window=1024),
        _c("phi3-mini", 32, 3072, 32, 32, None, 8192, PHI3, vocab_size=32064, max_positions=4096, seq_len=4096,
           sliding_window=2047),
        _c("phi3-medium", 40, 5120, 40, 10, None, 17920, PHI3, vocab_size=32064, max_positions=4096,
           seq_len=4096, sliding_window=2047),
        _c("phi4", 40, 5120, 40, 10, None, 17920, PHI3, vocab_size=100352, max_positions=16384, seq_len=4096),
        _c("olmo2-7b", 32, 4096, 32, 32, None, 11008, OLMO2),
        _c("olmo2-13b", 40, 5120, 40, 40, None, 13824, OLMO2),
    )
})


def family_presets(family: str):
    """The presets of one family (what ``stage models`` lists under it)."""
    return MappingProxyType({name: c for name, c in PRESETS.items() if c.family == family})
