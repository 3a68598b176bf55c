"""The STAGE plugin: registers the ``astrasim`` command and the ``astrasim`` simulator."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import CommandSpec, SimulatorSpec

from . import command


@hookimpl
def stage_commands():
    return [CommandSpec(name="astrasim", help=command.HELP,
                        configure=command.configure, run=command.run)]


@hookimpl
def stage_simulators():
    return [SimulatorSpec(name="astrasim", simulate=lambda directory, hw: command.simulate(directory, hw),
                          available=command.available, formats=("chakra",),
                          description="ASTRA-sim's analytical backend (congestion-unaware), $ASTRA_SIM_BIN or on PATH")]
