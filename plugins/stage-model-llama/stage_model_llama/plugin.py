"""STAGE plugin: registers the ``llama`` model family, which reads the config.json of any Llama-shaped decoder."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import ModelSpec

from .config import LlamaConfig
from .hf import READER
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
            hf_reader=READER,
            description="Llama-shaped decoders (Llama 2/3, Mistral, Qwen2.5/3, Granite, InternLM2, MiniCPM, GLM, "
                        "StarCoder2, Cohere, Falcon): GQA, RoPE or ALiBi, gated or GeLU MLPs, parallel blocks",
        )
    ]
