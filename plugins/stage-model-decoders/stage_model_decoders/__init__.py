"""STAGE model plugin: Gemma 2, Gemma 3, Phi-3/Phi-4 and OLMo 2, and their presets."""

from .config import DecoderConfig
from .hf import config_from_hf, to_hf
from .model import build
from .presets import PRESETS

__all__ = ["DecoderConfig", "PRESETS", "build", "config_from_hf", "to_hf"]
