"""Named GPT configurations (sources in the README).

* ``gpt-tiny``: the small default (2 layers, h 128) that runs anywhere in a blink.
* ``gpt2``..``gpt2-xl``: OpenAI GPT-2 shapes as in their Hugging Face config.json.
* ``gpt3-175b``: Brown et al. 2020, Table 2.1, vocabulary padded to 51200 as Megatron-LM
  pads it (multiple of 128 × tensor-parallel 8 = 1024).
* ``megatron-*``: the weak-scaling models of Narayanan et al. 2021 (arXiv 2104.04473),
  Table 1: vocabulary 51,200, sequence length 2048, and the attention those runs used:
  classic (scores, fused softmax, dropout and context as separate kernels; Megatron-LM had
  no FlashAttention in 2021), so a step is timed with the kernels that ran.
"""

from __future__ import annotations

from types import MappingProxyType

from .config import GPTConfig

GPT2_VOCAB = 50257

_GPT2 = {  # name: (layers, hidden, heads)
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
}

#: Narayanan et al. 2021, Table 1: name: (heads, hidden, layers); parameters as published (billions)
MEGATRON_TABLE1 = {
    "megatron-1.7b": (24, 2304, 24, 1.7),
    "megatron-3.6b": (32, 3072, 30, 3.6),
    "megatron-7.5b": (32, 4096, 36, 7.5),
    "megatron-18b": (48, 6144, 40, 18.4),
    "megatron-39b": (64, 8192, 48, 39.1),
    "megatron-76b": (80, 10240, 60, 76.1),
    "megatron-145b": (96, 12288, 80, 145.6),
    "megatron-310b": (128, 16384, 96, 310.1),
    "megatron-530b": (128, 20480, 105, 529.6),
    "megatron-1t": (160, 25600, 128, 1008.0),
}


def _presets() -> dict[str, GPTConfig]:
    out = {
        "gpt-tiny": GPTConfig(name="gpt-tiny", layers=2, hidden=128, heads=4, vocab_size=512,
                              max_positions=256, seq_len=256),
    }
    for name, (layers, hidden, heads) in _GPT2.items():
        out[name] = GPTConfig(name=name, layers=layers, hidden=hidden, heads=heads, vocab_size=GPT2_VOCAB,
                              max_positions=1024, seq_len=1024)
    out["gpt3-175b"] = GPTConfig(name="gpt3-175b", layers=96, hidden=12288, heads=96, vocab_size=GPT2_VOCAB,
                                 vocab_pad_to=1024, max_positions=2048, seq_len=2048)
    for name, (heads, hidden, layers, _billions) in MEGATRON_TABLE1.items():
        out[name] = GPTConfig(name=name, layers=layers, hidden=hidden, heads=heads, vocab_size=GPT2_VOCAB,
                              vocab_pad_to=1024, max_positions=2048, seq_len=2048, attention="classic")
    return out


PRESETS = MappingProxyType(_presets())
