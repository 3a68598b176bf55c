"""STAGE plugin: registers the ``moe`` model family and imports Hugging Face MoE configs."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import ModelSpec

from .config import MoEConfig
from .hf import MODEL_TYPES, config_from_hf
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
            hf_model_types=MODEL_TYPES,
            description="Mixture of experts: router, top-k, SwiGLU experts, shared experts; GQA or MLA attention",
        )
    ]


@hookimpl
def stage_config_from_hf(hf_config):
    """A MoEConfig for a mixtral, qwen2_moe, qwen3_moe or deepseek_v3 config.json (dict or path)."""
    return config_from_hf(hf_config)
