"""STAGE plugin: registers the fully connected family (mlp) and its presets."""

from __future__ import annotations

from stage_core.api import STANDARD_KERNELS, ModelSpec, hookimpl

from .model import MLPConfig, build_mlp
from .presets import MLPS


@hookimpl
def stage_models() -> list[ModelSpec]:
    return [ModelSpec("mlp", "mlp", build_mlp, MLPS, MLPConfig.from_dict, kernels=(STANDARD_KERNELS["relu"],),
                      description="fully connected layers (sigmoid or ReLU) and a softmax: the speech DNN of "
                                  "Das et al. 2016")]
