"""STAGE plugin: registers the ``gpt`` model family and imports Hugging Face gpt2 configs."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import ModelSpec

from .config import GPTConfig
from .hf import READER
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
            hf_reader=READER,
            description="GPT (Megatron-LM): learned positions, pre-LayerNorm, MHA, GeLU MLP, dropout",
        )
    ]
