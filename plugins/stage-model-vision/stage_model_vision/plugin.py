"""STAGE plugin: registers the image families (resnet, vgg, overfeat, vit)."""

from __future__ import annotations

from stage_core.api import STANDARD_KERNELS, ModelSpec, hookimpl

from .config import OverFeatConfig, ResNetConfig, VGGConfig, ViTConfig
from .model import build_overfeat, build_resnet, build_vgg, build_vit
from .presets import OVERFEATS, RESNETS, VGGS, VITS

CNN_KERNELS = tuple(STANDARD_KERNELS[k] for k in ("conv2d", "batchnorm", "relu", "maxpool", "avgpool"))


@hookimpl
def stage_models() -> list[ModelSpec]:
    return [
        ModelSpec("resnet", "resnet", build_resnet, RESNETS, ResNetConfig.from_dict, kernels=CNN_KERNELS,
                  description="ResNet (torchvision, v1.5): convolutions, BatchNorm, ReLU, residual blocks"),
        ModelSpec("vgg", "vgg", build_vgg, VGGS, VGGConfig.from_dict, kernels=CNN_KERNELS,
                  description="VGG (torchvision): 3x3 convolutions, max pooling, three fully connected layers"),
        ModelSpec("overfeat", "overfeat", build_overfeat, OVERFEATS, OverFeatConfig.from_dict, kernels=CNN_KERNELS,
                  description="OverFeat fast (Sermanet et al. 2014): five convolutions, three fully connected"),
        ModelSpec("vit", "vit", build_vit, VITS, ViTConfig.from_dict,
                  kernels=(STANDARD_KERNELS["conv2d"], STANDARD_KERNELS["first_token"]),
                  description="Vision Transformer (torchvision): patch convolution, class token, encoder, head"),
    ]
