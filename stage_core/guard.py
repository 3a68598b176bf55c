"""The border between the host and its plugins: every plugin callable, guarded.

The host hands out records whose callables (``ModelSpec.build``, ``StrategySpec.apply``,
``ScheduleSpec.order``, ``BackendSpec.write``...) are wrapped by :class:`Guarded`: an
exception raised inside becomes one :class:`PluginFault` line naming the plugin, its
distribution and the record (``plugin 'zb' (stage-schedule-zb 0.1): schedule 'zb-h1'
failed: KeyError: 3``).  A :class:`~stage_core.errors.StageError` a plugin raises on
purpose (a :class:`UsageError` for a user's mistake) passes through unchanged.  With
``STAGE_DEBUG=1`` the traceback is printed as well.

What a plugin returns is checked where it crosses into the core (schedules' orders in
:mod:`stage_core.schedule.steps`, strategies' declarations and models' graphs in
:mod:`stage_core.checks`), and a refusal is a :class:`PluginFault` too: exit status 1,
no set written.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import traceback
from typing import Any, Callable

from .errors import PluginError, StageError

DEBUG_ENV = "STAGE_DEBUG"


class PluginFault(PluginError):
    """A plugin raised, or returned something the host refuses: one line naming it."""

    exit_status = 1


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who a record comes from, as messages name it."""

    plugin: str
    dist: str = ""
    kind: str = ""  # "schedule", "strategy", "model family"...
    name: str = ""

    def __str__(self) -> str:
        where = f" ({self.dist})" if self.dist and self.dist != self.plugin else ""
        record = f": {self.kind} {self.name!r}" if self.kind else ""
        return f"plugin {self.plugin!r}{where}{record}"


def fault(owner: Owner | str, message: str) -> PluginFault:
    return PluginFault(f"{owner}: {message}")


def _raise_from(owner: Owner, what: str, exc: BaseException):
    if debug():
        traceback.print_exception(exc, file=sys.stderr)
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    raise fault(owner, f"{what} failed: {detail}") from exc


#: what passes the border unchanged: STAGE's own errors (a plugin's UsageError is the
#: user's mistake), the machine's (a full disk, no memory) and interruptions
_PASS = (StageError, OSError, MemoryError, KeyboardInterrupt, SystemExit, GeneratorExit)


class Guarded:
    """A plugin's callable, guarded: any exception but a StageError becomes a PluginFault
    naming ``owner``.  A generator's iteration is guarded too.  Picklable when the
    callable is."""

    def __init__(self, fn: Callable, owner: Owner, what: str):
        self.fn, self.owner, self.what = fn, owner, what
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        try:
            result = self.fn(*args, **kwargs)
        except _PASS:
            raise
        except Exception as exc:  # noqa: BLE001 - the plugin's failure, named
            _raise_from(self.owner, self.what, exc)
        if inspect.isgenerator(result):
            return self._iterate(result)
        return result

    def _iterate(self, gen):
        try:
            yield from gen
        except _PASS:
            raise
        except Exception as exc:  # noqa: BLE001
            _raise_from(self.owner, self.what, exc)

    def __repr__(self) -> str:
        return f"Guarded({self.fn!r}, {self.owner})"


#: record fields left unguarded: plain data, and a backend's reader (its errors are mostly a damaged
#: set's, which ``open_trace_set`` reports as a TraceReadError naming the file)
_UNGUARDED = {"read", "plugin", "name", "family", "description", "presets", "settings", "source", "options", "axes",
                "kernels", "hf_model_types", "formats", "format_id", "order_key", "axis", "help", "parameters",
                "gpu", "scale_up", "scale_out", "sources", "gpus_per_node"}


def guard_record(record: Any, owner: Owner) -> Any:
    """``record`` with each of its callables guarded (records are frozen dataclasses)."""
    changes = {}
    for f in dataclasses.fields(record):
        if f.name in _UNGUARDED:
            continue
        value = getattr(record, f.name)
        if callable(value) and not isinstance(value, (type, Guarded)):
            changes[f.name] = Guarded(value, owner, f"{f.name.replace('_', ' ')}")
    return dataclasses.replace(record, **changes) if changes else record


def call(owner: Owner, what: str, fn: Callable, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` (a plugin's code reached otherwise: a config's method),
    guarded as :class:`Guarded` guards record callables."""
    return Guarded(fn, owner, what)(*args, **kwargs)
