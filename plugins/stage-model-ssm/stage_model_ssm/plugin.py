"""STAGE plugin: registers the mamba, mamba2, nemotron_h, jamba and zamba2 families and imports their config.json files."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import ModelSpec

from .config import FAMILIES, HybridConfig
from .hf import READERS
from .model import KERNELS, build
from .presets import family_presets

DESCRIPTIONS = {
    "mamba": "Mamba-1 (Mamba, Falcon Mamba): the selective scan as one registered kernel, a depthwise conv",
    "jamba": "Jamba: Mamba-1 and attention layers (1 in 8), each with an MLP or a MoE (every other layer)",
    "mamba2": "Mamba-2: state-space layers (the SSD chunked scan as one kernel), a depthwise conv, gated RMSNorm",
    "zamba2": "Zamba2: Mamba-2 layers and shared transformer blocks (weights once, per-use LoRA adapters)",
    "nemotron_h": "Hybrid stacks of Mamba-2, attention, MLP and MoE layers from a layer pattern (Nemotron-H)",
}


@hookimpl
def stage_models() -> list[ModelSpec]:
    return [
        ModelSpec(name=family, family=family, build=build, presets=family_presets(family),
                  from_dict=HybridConfig.from_dict, hf_reader=READERS[family], description=DESCRIPTIONS[family],
                  kernels=KERNELS)
        for family in FAMILIES
    ]
