"""STAGE model plugin: BERT encoders with their pre-training heads."""

from .model import BertConfig, build_bert
from .presets import PRESETS

__all__ = ["BertConfig", "PRESETS", "build_bert"]
