"""Registers the A100 and H100 presets and the roofline and calibrated compute models."""

from stage_core import hookimpl

from .compute import CALIBRATED, ROOFLINE
from .presets import PRESETS


@hookimpl
def stage_hardware():
    return list(PRESETS)


@hookimpl
def stage_compute_models():
    return [ROOFLINE, CALIBRATED]
