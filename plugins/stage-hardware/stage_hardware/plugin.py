"""Registers the A100 and H100 presets (and as they were, ``a100-calibrated``, ``h100-calibrated``), Das et
al. 2016's CPU clusters, the roofline, calibrated, shaped and cpu compute models, and ``stage calibrate``."""

from stage_core import hookimpl
from stage_core.records import CommandSpec

from . import calibrate
from . import das2016
from .compute import CALIBRATED, CPU, ROOFLINE
from .presets import CALIBRATED_PRESETS, PRESETS
from .shaped import SHAPED


@hookimpl
def stage_hardware():
    return [*PRESETS, *CALIBRATED_PRESETS, *das2016.PRESETS]


@hookimpl
def stage_compute_models():
    return [ROOFLINE, CALIBRATED, SHAPED, CPU]


@hookimpl
def stage_commands():
    return [CommandSpec(name="calibrate", help=calibrate.HELP, configure=calibrate.configure, run=calibrate.run)]
