"""Errors a user can cause, and how the CLI reports them.

A :class:`UsageError` is a mistake in what the user asked for (an unknown model, a
degree that does not divide, an unwritable folder).  The CLI prints its message on
one line and exits with status 2; it never shows a traceback for one.  Every other
:class:`StageError` is one line too, with its class's ``exit_status`` (1: a bad trace
set, a failed write).
"""

from __future__ import annotations


class StageError(Exception):
    """Base class of STAGE's own errors."""

    exit_status = 1


class UsageError(StageError):
    """The user's input is wrong: the message names the value, why, and what is valid."""

    exit_status = 2


class PluginError(StageError):
    """A plugin is broken or clashes with another one (names the plugins)."""

    exit_status = 2


class OutputError(StageError):
    """A trace set could not be written (a full disk, an I/O error); nothing was changed."""

    exit_status = 1


class TraceReadError(StageError):
    """A trace set cannot be read.  ``path`` (the file), ``rank`` and ``offset`` (a byte
    of the file) say where, when known; the message starts with the rank and the file."""

    exit_status = 1

    def __init__(self, reason: str, *, path=None, rank: int | None = None, offset: int | None = None):
        super().__init__(reason)
        self.reason, self.path, self.rank, self.offset = reason, path, rank, offset

    def __reduce__(self):  # keep path, rank and offset across processes
        return type(self), (self.reason,), dict(self.__dict__)

    def __str__(self) -> str:
        where = [f"rank {self.rank}"] if self.rank is not None else []
        if self.path is not None:
            where.append(str(self.path))
        reason = self.reason
        if self.offset is not None and f"byte {self.offset}" not in reason:
            reason = f"byte {self.offset}: {reason}"
        return ": ".join([*where, reason])


class TraceWriteError(StageError):
    """A job cannot be written in a trace format (the message names the node or rank)."""

    exit_status = 1


class TraceError(StageError):
    """A trace set fails validation; ``problems`` lists each defect found."""

    exit_status = 1

    def __init__(self, problems):
        self.problems = list(problems)
        first = self.problems[0] if self.problems else "invalid trace set"
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        super().__init__(f"{first}{more}")
