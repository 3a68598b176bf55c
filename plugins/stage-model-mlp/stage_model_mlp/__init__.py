"""STAGE model plugin: fully connected networks (multilayer perceptrons)."""

from .model import MLPConfig, build_mlp
from .presets import MLPS

__all__ = ["MLPConfig", "build_mlp", "MLPS"]
