"""Hugging Face ``config.json`` (model_type llama, mistral, qwen2) to and from :class:`LlamaConfig`.

Keys read: ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads`` (absent or null: as many as the
heads), ``head_dim`` (absent or null: hidden_size / num_attention_heads),
``vocab_size``, ``max_position_embeddings``, ``tie_word_embeddings`` (default false),
``hidden_act`` (must be silu).  QKV bias: always on for qwen2 (Qwen2 has biases on
q, k and v only); llama's ``attention_bias`` and ``mlp_bias`` would also bias the
output projection and the MLP, which this family does not model, so true is
rejected.  ``sliding_window`` (mistral): every layer attends to its last
``sliding_window`` keys (null: the whole sequence); qwen2's ``use_sliding_window`` true
(a window on the layers from ``max_window_layers`` on) is refused.

STAGE's own settings that config.json has no key for (vocabulary padding, training
sequence length, attention kernel, dtype) travel in an optional ``"stage"`` object,
which :func:`to_hf` writes so that a config round-trips exactly.  Without it the
training sequence length is ``min(max_position_embeddings, 8192)``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from stage_core.api import HFKeys, UsageError

from .config import LlamaConfig

MODEL_TYPES = ("llama", "mistral", "qwen2")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
#: training sequence length when config.json says nothing (Llama 3 pre-trained at 8192)
DEFAULT_SEQ_CAP = 8192
SILU = ("silu", "swish")


def config_from_hf(source: Mapping[str, Any] | str | os.PathLike) -> LlamaConfig | None:
    """A :class:`LlamaConfig` from a llama/mistral/qwen2 config.json (dict or path); else ``None``."""
    r = HFKeys.load(source)
    model_type = r.model_type
    if model_type not in MODEL_TYPES:
        return None
    hidden = r.int("hidden_size")
    ffn = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    heads = r.int("num_attention_heads")
    vocab = r.int("vocab_size")
    positions = r.int("max_position_embeddings")
    kv_heads = r.int("num_key_value_heads", default=None) or heads
    head_dim = r.int("head_dim", default=None)
    if head_dim is None and hidden % heads:
        raise UsageError(
            f"{r.label}: num_attention_heads={heads} does not divide hidden_size={hidden} and there is no "
            f"head_dim (valid head counts divide {hidden})"
        )
    if heads % kv_heads:
        raise UsageError(
            f"{r.label}: num_key_value_heads={kv_heads} does not divide num_attention_heads={heads} "
            f"(valid values divide {heads})"
        )
    if r.get("hidden_act", "silu") not in SILU:
        r.fail("hidden_act", "this family's MLP is SwiGLU; valid: silu")
    tie = r.bool("tie_word_embeddings", False)
    window = r.int("sliding_window", default=None) if model_type == "mistral" else None
    if model_type == "qwen2" and r.bool("use_sliding_window", False):
        r.fail("use_sliding_window", "Qwen2's window on the upper layers is not modelled; valid: false")
    for key in ("attention_bias", "mlp_bias"):
        if r.bool(key, False):
            raise UsageError(
                f"{r.label}: key {key!r}=true is not supported: it biases "
                f"{'the output projection as well as q, k, v' if key == 'attention_bias' else 'the MLP'}; "
                f"only QKV bias (qwen2) is modelled"
            )

    fields: dict[str, Any] = {
        "name": r.model_name,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "ffn_hidden": ffn,
        "vocab_size": vocab,
        "max_positions": positions,
        "seq_len": min(positions, DEFAULT_SEQ_CAP),
        "tie_embeddings": tie,
        "qkv_bias": model_type == "qwen2",
        "sliding_window": window,
    }
    return r.make(LlamaConfig, fields)


def to_hf(config: LlamaConfig, model_type: str | None = None) -> dict[str, Any]:
    """``config`` as a config.json dict; ``config_from_hf(to_hf(c)) == c`` when kv_heads is set.

    ``model_type`` defaults to qwen2 for a config with QKV bias, mistral for one with a
    sliding window and llama otherwise; mistral is also valid for a config without either.
    """
    c = config
    mt = model_type or ("qwen2" if c.qkv_bias else "mistral" if c.sliding_window else "llama")
    if mt not in MODEL_TYPES:
        raise UsageError(f"model_type {mt!r}: valid values are {', '.join(MODEL_TYPES)}")
    if (mt == "qwen2") != c.qkv_bias:
        raise UsageError(
            f"model_type {mt!r} cannot express qkv_bias={c.qkv_bias}: qwen2 always has QKV bias, "
            f"llama and mistral have none"
        )
    if c.sliding_window is not None and mt != "mistral":
        raise UsageError(f"model_type {mt!r} cannot express sliding_window={c.sliding_window}: only mistral has "
                         f"a window in every layer")
    out: dict[str, Any] = {
        "model_type": mt,
        "architectures": [ARCHITECTURES[mt]],
        "hidden_size": c.hidden,
        "intermediate_size": c.ffn_hidden,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.groups,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_positions,
        "tie_word_embeddings": c.tie_embeddings,
        "hidden_act": "silu",
    }
    if c.head_dim is not None:
        out["head_dim"] = c.head_dim
    if mt == "mistral":
        out["sliding_window"] = c.sliding_window
    if mt == "llama":
        out["attention_bias"] = False
        out["mlp_bias"] = False
    out["stage"] = c.stage_block()
    return out

