"""STAGE plugin: registers the ``bert`` family and imports Hugging Face bert config.json files."""

from __future__ import annotations

from typing import Any

from stage_core.api import HFKeys, ModelSpec, hookimpl

from .model import KERNELS, BertConfig, build_bert
from .presets import PRESETS

MODEL_TYPES = ("bert",)


@hookimpl
def stage_models() -> list[ModelSpec]:
    return [ModelSpec("bert", "bert", build_bert, PRESETS, BertConfig.from_dict, hf_model_types=MODEL_TYPES,
                      kernels=KERNELS,
                      description="BERT with its pre-training heads (masked LM, next sentence), bidirectional "
                                  "attention")]


@hookimpl
def stage_config_from_hf(hf_config: Any):
    """A BertConfig from a bert config.json (hidden_size, num_hidden_layers, num_attention_heads,
    intermediate_size, vocab_size, max_position_embeddings, type_vocab_size)."""
    r = HFKeys.load(hf_config)
    if r.model_type not in MODEL_TYPES:
        return None
    positions = r.int("max_position_embeddings")
    fields = {"name": r.model_name, "layers": r.int("num_hidden_layers"), "hidden": r.int("hidden_size"),
              "heads": r.int("num_attention_heads"), "ffn_hidden": r.int("intermediate_size"),
              "vocab_size": r.int("vocab_size"), "type_vocab": r.int("type_vocab_size", default=2),
              "max_positions": positions, "seq_len": positions}
    return r.make(BertConfig, fields, keys={"layers": "num_hidden_layers", "hidden": "hidden_size",
                                            "heads": "num_attention_heads", "ffn_hidden": "intermediate_size"})
