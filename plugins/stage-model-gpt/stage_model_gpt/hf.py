"""Hugging Face ``config.json`` (model_type ``gpt2``) to and from :class:`GPTConfig`.

Keys read: ``n_embd``, ``n_layer``, ``n_head``, ``n_positions`` (or the older
``n_ctx``), ``vocab_size``, ``n_inner`` (null: 4·n_embd), ``tie_word_embeddings``
(default true).  STAGE's own settings that config.json has no key for (vocabulary
padding, training sequence length, attention kernel, dtype) travel in an optional
``"stage"`` object, which :func:`to_hf` writes so that a config round-trips exactly.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from stage_core.api import HFKeys, HFReader, UsageError, load_hf_config

from .config import GPTConfig

MODEL_TYPES = ("gpt2",)


def config_from_hf(source: Mapping[str, Any] | str | os.PathLike) -> GPTConfig | None:
    """A :class:`GPTConfig` from a GPT-2 style config.json (dict or path, keys ``n_embd``,
    ``n_layer``, ``n_head``); ``None`` for a config without them."""
    data, label = load_hf_config(source)
    if not READER.can_read(data):
        return None
    return read(HFKeys(data, label))


def read(r: HFKeys) -> GPTConfig:
    """A :class:`GPTConfig` from a config.json's keys (raises UsageError naming a key)."""
    hidden = r.int("n_embd")
    layers = r.int("n_layer")
    heads = r.int("n_head")
    positions = r.int("n_positions", or_keys=("n_ctx",))
    vocab = r.int("vocab_size")
    if hidden % heads:
        raise UsageError(
            f"{r.label}: n_head={heads} does not divide n_embd={hidden} "
            f"(the head dim is n_embd/n_head; valid head counts divide {hidden})"
        )
    fields: dict[str, Any] = {
        "name": r.model_name,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "ffn_hidden": r.int("n_inner", default=None),
        "vocab_size": vocab,
        "max_positions": positions,
        "seq_len": positions,
        "tie_embeddings": r.bool("tie_word_embeddings", True),
    }
    return r.make(GPTConfig, fields)


READER = HFReader(read=read, requires=(("n_embd",), ("n_layer",), ("n_head",), ("vocab_size",)),
                  reads=("n_positions", "n_ctx", "n_inner", "tie_word_embeddings"), model_types=MODEL_TYPES)


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
        "stage": c.stage_block(),
    }

