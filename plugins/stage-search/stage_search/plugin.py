"""Registers ``stage sweep``, ``stage estimate``, ``stage search``, the ``local`` executor and
the ``replay`` estimator."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import CommandSpec, EstimatorSpec, ExecutorSpec

from . import estimate_command, estimator, executors, search, sweep


@hookimpl
def stage_commands():
    return [CommandSpec(name="sweep", help=sweep.HELP, configure=sweep.configure, run=sweep.run),
            CommandSpec(name="estimate", help=estimate_command.HELP, configure=estimate_command.configure,
                        run=estimate_command.run),
            CommandSpec(name="search", help=search.HELP, configure=search.configure, run=search.run)]


@hookimpl(trylast=True)
def stage_executors():
    return [ExecutorSpec("local", executors.local, "processes on this machine (--workers N, default every core)",
                         options=("workers",))]


@hookimpl
def stage_estimators():
    return [EstimatorSpec("replay", estimator.estimate, estimator.DESCRIPTION)]
