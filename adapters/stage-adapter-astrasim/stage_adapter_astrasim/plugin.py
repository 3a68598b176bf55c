"""The STAGE plugin: registers the ``astrasim`` command."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import CommandSpec

from . import command


@hookimpl
def stage_commands():
    return [CommandSpec(name="astrasim", help=command.HELP,
                        configure=command.configure, run=command.run)]
