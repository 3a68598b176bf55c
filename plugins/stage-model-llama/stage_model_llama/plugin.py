"""STAGE plugin: registers the ``llama`` model family and imports llama, mistral and qwen2 configs."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import ModelSpec

from .config import LlamaConfig
from .hf import MODEL_TYPES, config_from_hf
from .model import build
from .presets import PRESETS


@hookimpl
def stage_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="llama",
            family="llama",
            build=build,
            presets=PRESETS,
            from_dict=LlamaConfig.from_dict,
            hf_model_types=MODEL_TYPES,
            description="LLaMA family (Llama 2/3, Mistral, Qwen2.5): RoPE, RMSNorm, GQA, SwiGLU",
        )
    ]


@hookimpl
def stage_config_from_hf(hf_config):
    """A LlamaConfig for a llama/mistral/qwen2 config.json (a parsed dict, or a path to it or its folder)."""
    return config_from_hf(hf_config)
