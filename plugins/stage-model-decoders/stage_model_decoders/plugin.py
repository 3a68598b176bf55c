"""STAGE plugin: registers the gemma2, gemma3, phi3 and olmo2 families and imports their config.json files."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import ModelSpec

from .config import FAMILIES, DecoderConfig
from .hf import READERS
from .model import build
from .presets import family_presets

DESCRIPTIONS = {
    "gemma2": "Gemma 2: local/global attention, logit soft-capping, sandwich norms, GeGLU, head dim apart from h/a",
    "gemma3": "Gemma 3 (text): 5 local layers per global one, per-head q/k norms, sandwich norms, GeGLU",
    "phi3": "Phi-3 and Phi-4: GQA with RoPE, SwiGLU, sliding-window attention in every layer (Phi-3)",
    "olmo2": "OLMo 2: norms after each block, q/k norms over all heads, SwiGLU",
}


@hookimpl
def stage_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name=family,
            family=family,
            build=build,
            presets=family_presets(family),
            from_dict=DecoderConfig.from_dict,
            hf_reader=READERS[family],
            description=DESCRIPTIONS[family],
        )
        for family in FAMILIES
    ]
