"""Registers the A100 and H100 presets, Das et al. 2016's CPU clusters, the roofline, calibrated and cpu
compute models, and
``stage calibrate``."""

from stage_core import hookimpl
from stage_core.records import CommandSpec

from . import calibrate
from . import das2016
from .compute import CALIBRATED, CPU, ROOFLINE
from .presets import PRESETS


@hookimpl
def stage_hardware():
    return [*PRESETS, *das2016.PRESETS]


@hookimpl
def stage_compute_models():
    return [ROOFLINE, CALIBRATED, CPU]


@hookimpl
def stage_commands():
    return [CommandSpec(name="calibrate", help=calibrate.HELP, configure=calibrate.configure, run=calibrate.run)]
