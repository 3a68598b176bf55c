"""Hugging Face ``config.json`` (model_type ``gpt2``) to and from :class:`GPTConfig`.

Keys read: ``n_embd``, ``n_layer``, ``n_head``, ``n_positions`` (or the older
``n_ctx``), ``vocab_size``, ``n_inner`` (null: 4·n_embd), ``tie_word_embeddings``
(default true).  STAGE's own settings that config.json has no key for (vocabulary
padding, training sequence length, attention kernel, dtype) travel in an optional
``"stage"`` object, which :func:`to_hf` writes so that a config round-trips exactly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from stage_core.errors import UsageError

from .config import GPTConfig

MODEL_TYPES = ("gpt2",)
#: GPTConfig fields carried in config.json's "stage" object
STAGE_KEYS = ("name", "vocab_pad_to", "seq_len", "attention", "causal_flops", "dtype")


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


def config_from_hf(source: Mapping[str, Any] | str | os.PathLike) -> GPTConfig | None:
    """A :class:`GPTConfig` from a gpt2 config.json (dict or path); ``None`` for other model types."""
    hf, where = load(source)
    if hf.get("model_type") not in MODEL_TYPES:
        return None

    def need(*keys: str) -> tuple[str, int]:
        for key in keys:
            if key in hf and hf[key] is not None:
                return key, _positive_int(hf, key, where)
        raise UsageError(f"{where}: required key {keys[0]!r} is missing (model_type {hf['model_type']!r})")

    _, hidden = need("n_embd")
    _, layers = need("n_layer")
    heads_key, heads = need("n_head")
    _, positions = need("n_positions", "n_ctx")
    _, vocab = need("vocab_size")
    if hidden % heads:
        raise UsageError(
            f"{where}: {heads_key}={heads} does not divide n_embd={hidden} "
            f"(the head dim is n_embd/{heads_key}; valid head counts divide {hidden})"
        )
    ffn = None if hf.get("n_inner") is None else _positive_int(hf, "n_inner", where)
    tie = hf.get("tie_word_embeddings", True)
    if not isinstance(tie, bool):
        raise UsageError(f"{where}: key 'tie_word_embeddings'={tie!r}: expected true or false")

    fields: dict[str, Any] = {
        "name": str(hf.get("_name_or_path") or "hf-gpt2"),
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "ffn_hidden": ffn,
        "vocab_size": vocab,
        "max_positions": positions,
        "seq_len": positions,
        "tie_embeddings": tie,
    }
    fields.update(_stage_section(hf, where))
    try:
        return GPTConfig(**fields)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None


def to_hf(config: GPTConfig) -> dict[str, Any]:
    """``config`` as a gpt2 config.json dict; ``config_from_hf(to_hf(c)) == c``."""
    c = config
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": c.hidden,
        "n_layer": c.layers,
        "n_head": c.heads,
        "n_positions": c.max_positions,
        "n_ctx": c.max_positions,
        "n_inner": c.ffn_hidden,
        "vocab_size": c.vocab_size,
        "activation_function": "gelu_new",
        "tie_word_embeddings": c.tie_embeddings,
        "stage": {key: getattr(c, key) for key in STAGE_KEYS},
    }


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
