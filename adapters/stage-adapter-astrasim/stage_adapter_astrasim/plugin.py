"""The STAGE plugin: the ``astrasim`` command, and a simulator per ASTRA-sim network backend
(``astrasim``: analytical, ``astrasim-aware``, ``astrasim-htsim``)."""

from __future__ import annotations

from functools import partial

from stage_core import hookimpl
from stage_core.records import CommandSpec, SimulatorSpec

from . import command, simulate
from .backends import BACKENDS


@hookimpl
def stage_commands():
    return [CommandSpec(name="astrasim", help=command.HELP,
                        configure=command.configure, run=command.run)]


@hookimpl
def stage_simulators():
    return [SimulatorSpec(name=b.simulator, simulate=partial(simulate.simulate_record, b),
                          available=partial(simulate.why_unavailable, b), formats=("chakra",),
                          description=b.description,
                          time_limit_s=None if b.time_limit_ns is None else b.time_limit_ns / 1e9,
                          binary_env=b.env_var)
            for b in BACKENDS.values()]
