"""Named image models (sources in the README): torchvision's ResNet-18/34/50/101/152 and
VGG-11 (VGG-A)/VGG-13/VGG-16/VGG-19 on 224x224 images; OverFeat fast on 231x231 (Sermanet
et al. 2014); torchvision's ViT-B/16 and ViT-L/16 on 224x224."""

from __future__ import annotations

from types import MappingProxyType

from .config import RESNET_DEPTHS, OverFeatConfig, ResNetConfig, VGGConfig, ViTConfig

RESNETS = MappingProxyType({f"resnet{d}": ResNetConfig(name=f"resnet{d}", depth=d) for d in RESNET_DEPTHS})
VGGS = MappingProxyType({
    "vgg-a": VGGConfig(name="vgg-a", variant="A"),  # VGG-11
    "vgg13": VGGConfig(name="vgg13", variant="B"),
    "vgg16": VGGConfig(name="vgg16", variant="D"),
    "vgg19": VGGConfig(name="vgg19", variant="E"),
})
OVERFEATS = MappingProxyType({"overfeat-fast": OverFeatConfig(name="overfeat-fast")})
VITS = MappingProxyType({
    "vit-b16": ViTConfig(name="vit-b16", layers=12, hidden=768, heads=12, mlp=3072),
    "vit-l16": ViTConfig(name="vit-l16", layers=24, hidden=1024, heads=16, mlp=4096),
})
