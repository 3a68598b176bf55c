"""The configs of the image families: ResNet, VGG, OverFeat (convolutional, no sequence dim)
and ViT (a transformer over image patches, its sequence fixed by the image size).

Fields are plain values, so ``--set image_size=64`` or ``--set classes=10`` round-trips
through manifests.  A micro-batch is ``--micro-batch-size`` images; the image size is the
model's (``--set image_size=N``), so plans of a CNN have no ``--seq-len``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from stage_core.api import (ATTENTION_KINDS, DTYPES, ModelConfig, UsageError, check_bool, check_choice, check_int,
                            check_str)

#: ResNet depth -> (block kind, blocks per stage); He et al. 2016, Table 1
RESNET_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}

#: VGG configurations (Simonyan & Zisserman 2015, Table 1): output channels of each 3x3
#: convolution, "M" a 2x2 max pooling
VGG_VARIANTS = {
    "A": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "B": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "D": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "E": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


def _family(cfg, family: str) -> None:
    check_str(cfg, "name")
    if cfg.family != family:
        raise UsageError(f"{type(cfg).__name__} family={cfg.family!r}: its family must be {family!r}")


@dataclass(frozen=True)
class ResNetConfig(ModelConfig):
    """ResNet (He et al. 2016) as torchvision builds it: a 7x7 stem, four stages of basic
    or bottleneck blocks (stride on the 3x3 convolution, v1.5), BatchNorm after every
    convolution, global average pooling and a fully connected classifier."""

    SEQUENCE: ClassVar[str] = "none"

    name: str = "resnet50"
    family: str = "resnet"
    depth: int = 50
    image_size: int = 224
    classes: int = 1000
    width: int = 64  # the stem's channels; stage i has width * 2**i inner channels
    sync_batchnorm: bool = False  # SyncBatchNorm: statistics all-reduced over the data-parallel ranks
    dtype: str = "bf16"

    def __post_init__(self):
        _family(self, "resnet")
        check_int(self, "depth", "image_size", "classes", "width")
        if self.depth not in RESNET_DEPTHS:
            raise UsageError(f"ResNetConfig depth={self.depth}: valid depths are "
                             f"{', '.join(map(str, RESNET_DEPTHS))}")
        if self.image_size < 32:
            raise UsageError(f"ResNetConfig image_size={self.image_size}: five stride-2 steps need at least 32 pixels")
        check_bool(self, "sync_batchnorm")
        check_choice(self, "dtype", DTYPES)

    @property
    def layers(self) -> int:
        """Blocks (the layers pipeline stages split on)."""
        return sum(RESNET_DEPTHS[self.depth][1])


@dataclass(frozen=True)
class VGGConfig(ModelConfig):
    """VGG (Simonyan & Zisserman 2015): 3x3 convolutions with ReLU and 2x2 max pooling,
    then three fully connected layers (4096, 4096, classes) with dropout, as torchvision
    builds it (an adaptive pool to 7x7 before the classifier)."""

    SEQUENCE: ClassVar[str] = "none"

    name: str = "vgg-a"
    family: str = "vgg"
    variant: str = "A"
    image_size: int = 224
    classes: int = 1000
    fc_width: int = 4096
    dtype: str = "bf16"

    def __post_init__(self):
        _family(self, "vgg")
        check_choice(self, "variant", tuple(VGG_VARIANTS))
        check_int(self, "image_size", "classes", "fc_width")
        if self.image_size < 32:
            raise UsageError(f"VGGConfig image_size={self.image_size}: five 2x2 poolings need at least 32 pixels")
        check_choice(self, "dtype", DTYPES)

    @property
    def layers(self) -> int:
        return sum(1 for v in VGG_VARIANTS[self.variant] if v != "M") + 3


@dataclass(frozen=True)
class OverFeatConfig(ModelConfig):
    """OverFeat's fast model (Sermanet et al. 2014, Table 1): five convolutions (11x11
    stride 4, 5x5, three 3x3), three max poolings, and three fully connected layers
    (3072, 4096, classes) with dropout, on 231x231 images."""

    SEQUENCE: ClassVar[str] = "none"

    name: str = "overfeat-fast"
    family: str = "overfeat"
    image_size: int = 231
    classes: int = 1000
    dtype: str = "bf16"

    def __post_init__(self):
        _family(self, "overfeat")
        check_int(self, "image_size", "classes")
        if self.image_size < 87:
            raise UsageError(f"OverFeatConfig image_size={self.image_size}: its convolutions and poolings need at "
                             f"least 87 pixels")
        check_choice(self, "dtype", DTYPES)

    @property
    def layers(self) -> int:
        return 8


@dataclass(frozen=True)
class ViTConfig(ModelConfig):
    """A Vision Transformer (Dosovitskiy et al. 2021) as torchvision builds it: a patch
    convolution, a class token, learned positions, pre-LayerNorm encoder layers of
    multi-head (bidirectional) attention and a GeLU MLP, the class token's final norm
    and a linear head.  Its sequence is the patches plus the class token, fixed by the
    image size."""

    SEQUENCE: ClassVar[str] = "fixed"

    name: str = "vit-b16"
    family: str = "vit"
    image_size: int = 224
    patch: int = 16
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    mlp: int = 3072
    classes: int = 1000
    attention: str = "flash"
    dtype: str = "bf16"

    def __post_init__(self):
        _family(self, "vit")
        check_int(self, "image_size", "patch", "layers", "hidden", "heads", "mlp", "classes")
        if self.image_size % self.patch:
            raise UsageError(f"ViTConfig patch={self.patch} does not divide image_size={self.image_size}: the image "
                             f"splits into whole patches")
        if self.hidden % self.heads:
            raise UsageError(f"ViTConfig heads={self.heads} does not divide hidden={self.hidden}")
        check_choice(self, "attention", ATTENTION_KINDS)
        check_choice(self, "dtype", DTYPES)

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch) ** 2

    @property
    def seq_len(self) -> int:
        """Tokens: the patches and the class token."""
        return self.patches + 1

    def dims(self) -> dict[str, int]:
        """The model's dims; ``s`` too, since the config fixes it (the plan binds the same value)."""
        return {"h": self.hidden, "a": self.heads, "g": self.heads, "d": self.hidden // self.heads, "f": self.mlp,
                "V": self.classes, "s": self.seq_len}
