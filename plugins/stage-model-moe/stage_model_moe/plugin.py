"""STAGE plugin: registers the ``moe`` model family and imports Hugging Face MoE configs."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import ModelSpec

from .config import MoEConfig
from .hf import READER
from .model import build
from .presets import PRESETS


@hookimpl
def stage_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="moe",
            family="moe",
            build=build,
            presets=PRESETS,
            from_dict=MoEConfig.from_dict,
            hf_reader=READER,
            description="Mixture of experts: router, top-k, SwiGLU experts, shared experts; GQA or MLA attention",
        )
    ]
