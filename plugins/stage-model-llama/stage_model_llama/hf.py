"""Hugging Face ``config.json`` (model_type llama, mistral, qwen2) to and from :class:`LlamaConfig`.

Keys read: ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads`` (absent or null: as many as the
heads), ``head_dim`` (absent or null: hidden_size / num_attention_heads),
``vocab_size``, ``max_position_embeddings``, ``tie_word_embeddings`` (default false),
``hidden_act`` (must be silu).  QKV bias: always on for qwen2 (Qwen2 has biases on
q, k and v only); llama's ``attention_bias`` and ``mlp_bias`` would also bias the
output projection and the MLP, which this family does not model, so true is
rejected.  ``sliding_window`` (Mistral) is not modelled: attention is full causal
attention over the sequence.

STAGE's own settings that config.json has no key for (vocabulary padding, training
sequence length, attention kernel, dtype) travel in an optional ``"stage"`` object,
which :func:`to_hf` writes so that a config round-trips exactly.  Without it the
training sequence length is ``min(max_position_embeddings, 8192)``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from stage_core.errors import UsageError

from .config import LlamaConfig

MODEL_TYPES = ("llama", "mistral", "qwen2")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
#: LlamaConfig fields carried in config.json's "stage" object
STAGE_KEYS = ("name", "vocab_pad_to", "seq_len", "attention", "causal_flops", "dtype")
#: training sequence length when config.json says nothing (Llama 3 pre-trained at 8192)
DEFAULT_SEQ_CAP = 8192
SILU = ("silu", "swish")


def load(source: Mapping[str, Any] | str | os.PathLike) -> tuple[Mapping[str, Any], str]:
    """A parsed config.json and a label for messages; ``source`` may be a dict, a file or a folder."""
    if isinstance(source, Mapping):
        return source, "config.json"
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read Hugging Face config {str(path)!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"Hugging Face config {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise UsageError(f"Hugging Face config {str(path)!r} must hold a JSON object")
    return data, str(path)


def config_from_hf(source: Mapping[str, Any] | str | os.PathLike) -> LlamaConfig | None:
    """A :class:`LlamaConfig` from a llama/mistral/qwen2 config.json (dict or path); else ``None``."""
    hf, where = load(source)
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        return None

    def need(key: str) -> int:
        if hf.get(key) is None:
            raise UsageError(f"{where}: required key {key!r} is missing (model_type {model_type!r})")
        return _positive_int(hf, key, where)

    def optional(key: str) -> int | None:
        return None if hf.get(key) is None else _positive_int(hf, key, where)

    hidden = need("hidden_size")
    ffn = need("intermediate_size")
    layers = need("num_hidden_layers")
    heads = need("num_attention_heads")
    vocab = need("vocab_size")
    positions = need("max_position_embeddings")
    kv_heads = optional("num_key_value_heads") or heads
    head_dim = optional("head_dim")
    if head_dim is None and hidden % heads:
        raise UsageError(
            f"{where}: num_attention_heads={heads} does not divide hidden_size={hidden} and there is no "
            f"head_dim (valid head counts divide {hidden})"
        )
    if heads % kv_heads:
        raise UsageError(
            f"{where}: num_key_value_heads={kv_heads} does not divide num_attention_heads={heads} "
            f"(valid values divide {heads})"
        )
    act = hf.get("hidden_act", "silu")
    if act not in SILU:
        raise UsageError(f"{where}: key 'hidden_act'={act!r}: this family's MLP is SwiGLU; valid: silu")
    tie = _bool(hf, "tie_word_embeddings", False, where)
    for key in ("attention_bias", "mlp_bias"):
        if _bool(hf, key, False, where):
            raise UsageError(
                f"{where}: key {key!r}=true is not supported: it biases "
                f"{'the output projection as well as q, k, v' if key == 'attention_bias' else 'the MLP'}; "
                f"only QKV bias (qwen2) is modelled"
            )

    fields: dict[str, Any] = {
        "name": str(hf.get("_name_or_path") or f"hf-{model_type}"),
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
    }
    fields.update(_stage_section(hf, where))
    try:
        return LlamaConfig(**fields)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None


def to_hf(config: LlamaConfig, model_type: str | None = None) -> dict[str, Any]:
    """``config`` as a config.json dict; ``config_from_hf(to_hf(c)) == c`` when kv_heads is set.

    ``model_type`` defaults to qwen2 for a config with QKV bias and llama otherwise;
    mistral is also valid for a config without QKV bias.
    """
    c = config
    mt = model_type or ("qwen2" if c.qkv_bias else "llama")
    if mt not in MODEL_TYPES:
        raise UsageError(f"model_type {mt!r}: valid values are {', '.join(MODEL_TYPES)}")
    if (mt == "qwen2") != c.qkv_bias:
        raise UsageError(
            f"model_type {mt!r} cannot express qkv_bias={c.qkv_bias}: qwen2 always has QKV bias, "
            f"llama and mistral have none"
        )
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
    if mt == "llama":
        out["attention_bias"] = False
        out["mlp_bias"] = False
    out["stage"] = {key: getattr(c, key) for key in STAGE_KEYS}
    return out


def _stage_section(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    section = hf.get("stage")
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise UsageError(f"{where}: key 'stage' must be an object with keys {', '.join(STAGE_KEYS)}")
    unknown = sorted(set(section) - set(STAGE_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key(s) stage.{', stage.'.join(unknown)}; valid: {', '.join(STAGE_KEYS)}")
    return dict(section)


def _positive_int(hf: Mapping[str, Any], key: str, where: str) -> int:
    value = hf[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{where}: key {key!r}={value!r}: expected a positive integer")
    return value


def _bool(hf: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = hf.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise UsageError(f"{where}: key {key!r}={value!r}: expected true or false")
    return value
