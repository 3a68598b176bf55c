"""Registers ``stage dataset`` and ``stage from-dag``."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import CommandSpec

from . import dataset, fromdag


@hookimpl
def stage_commands():
    return [CommandSpec(name="dataset", help=dataset.HELP, configure=dataset.configure, run=dataset.run),
            CommandSpec(name="from-dag", help=fromdag.HELP, configure=fromdag.configure, run=fromdag.run)]
