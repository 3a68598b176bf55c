"""STAGE model plugin: mixture-of-experts decoders (Mixtral, Qwen-MoE, DeepSeek-V3) and their presets."""

from .config import MoEConfig
from .hf import config_from_hf, to_hf
from .model import build
from .presets import PRESETS

__all__ = ["MoEConfig", "PRESETS", "build", "config_from_hf", "to_hf"]
