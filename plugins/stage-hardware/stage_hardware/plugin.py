"""Registers the A100 and H100 presets, the roofline and calibrated compute models, and
``stage calibrate``."""

from stage_core import hookimpl
from stage_core.records import CommandSpec

from . import calibrate
from .compute import CALIBRATED, ROOFLINE
from .presets import PRESETS


@hookimpl
def stage_hardware():
    return list(PRESETS)


@hookimpl
def stage_compute_models():
    return [ROOFLINE, CALIBRATED]


@hookimpl
def stage_commands():
    return [CommandSpec(name="calibrate", help=calibrate.HELP, configure=calibrate.configure, run=calibrate.run)]
