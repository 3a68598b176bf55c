"""STAGE model plugin: image models (ResNet, VGG, OverFeat, ViT)."""

from .config import OverFeatConfig, ResNetConfig, VGGConfig, ViTConfig
from .model import build_overfeat, build_resnet, build_vgg, build_vit
from .presets import OVERFEATS, RESNETS, VGGS, VITS

__all__ = ["OverFeatConfig", "ResNetConfig", "VGGConfig", "ViTConfig", "build_overfeat", "build_resnet", "build_vgg",
           "build_vit", "OVERFEATS", "RESNETS", "VGGS", "VITS"]
