"""STAGE plugin: registers the ``gpt`` model family and imports Hugging Face gpt2 configs."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import ModelSpec

from .config import GPTConfig
from .hf import MODEL_TYPES, config_from_hf
from .model import build
from .presets import PRESETS


@hookimpl
def stage_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="gpt",
            family="gpt",
            build=build,
            presets=PRESETS,
            from_dict=GPTConfig.from_dict,
            hf_model_types=MODEL_TYPES,
            description="GPT (Megatron-LM): learned positions, pre-LayerNorm, MHA, GeLU MLP, dropout",
        )
    ]


@hookimpl
def stage_config_from_hf(hf_config):
    """A GPTConfig for a gpt2 config.json (a parsed dict, or a path to the file or its folder)."""
    return config_from_hf(hf_config)
