"""STAGE model plugin: Mamba-2 and hybrid Mamba-2/attention/MLP/MoE stacks, and their presets."""

from .config import HybridConfig
from .hf import config_from_hf, to_hf
from .model import build
from .presets import PRESETS

__all__ = ["HybridConfig", "PRESETS", "build", "config_from_hf", "to_hf"]
