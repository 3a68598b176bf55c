"""STAGE model plugin: the LLaMA family (Llama 2/3, Mistral, Qwen2.5) and its presets."""

from .config import LlamaConfig
from .hf import config_from_hf, to_hf
from .model import build
from .presets import PRESETS

__all__ = ["LlamaConfig", "PRESETS", "build", "config_from_hf", "to_hf"]
