"""STAGE model plugin: the GPT family (Megatron-LM's GPT) and its presets."""

from .config import GPTConfig
from .hf import config_from_hf, to_hf
from .model import build
from .presets import PRESETS

__all__ = ["GPTConfig", "PRESETS", "build", "config_from_hf", "to_hf"]
