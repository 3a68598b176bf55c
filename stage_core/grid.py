"""A grid of plans (TOML) and the points it stands for: what ``stage sweep`` and
``stage dataset`` read.

::

    measure = "report"            # what every point computes (each command lists its measures)

    [base]                        # settings every point shares: report/generate flags
    model = "llama3-8b"           #   without their dashes ("seq-len", "sp", ...)
    seq-len = 4096

    [grid]                        # each key a list; the points are their product
    tp = [1, 2, 4, 8]
    dp = [1, 2]
    system = ["h100", "a100"]     # hardware settings sit beside the plan flags

``grid`` may also be an array of tables (``[[grid]]``): the points are the union of
their products, in order, without repeats.

The command reading a grid passes the settings a point may have (``flag_names``: the
plan flags of ``stage report`` without dashes, :func:`stage_core.planning.setting_names`)
and the measures it knows (the first is the default).
"""

from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import UsageError
from .inputs import read_text
from .planning import settings_flags

#: settings that describe the machine rather than the plan
HARDWARE_KEYS = ("system",)
#: the most points one sweep evaluates (each a plan; a unit, a row and a cache file)
MAX_POINTS = 100_000


@dataclass(frozen=True)
class Point:
    """One point of a sweep: the plan flags (a CLI argument list) and the hardware."""

    settings: tuple[tuple[str, Any], ...]  # (key, value) in the spec's key order

    def flags(self) -> list[str]:
        return settings_flags({k: v for k, v in self.settings if k not in HARDWARE_KEYS})

    def hardware(self) -> dict[str, Any]:
        return {k: v for k, v in self.settings if k in HARDWARE_KEYS}

    def as_dict(self) -> dict[str, Any]:
        return dict(self.settings)


@dataclass(frozen=True)
class Sweep:
    measure: str
    points: tuple[Point, ...]
    keys: tuple[str, ...]  # every setting a point may have, in first-seen order


def load(path: Path, flag_names: Iterable[str], measures: Iterable[str]) -> Sweep:
    """Read and check ``path``; ``flag_names`` are the valid plan flags (without dashes)."""
    text = read_text(path, str(path))  # a regular file, bounded (a FIFO would block)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise UsageError(f"{path}: not TOML STAGE reads (nested too deep)") from None
    return parse(data, str(path), flag_names, measures)


def parse(data: Mapping[str, Any], where: str, flag_names: Iterable[str], measures: Iterable[str]) -> Sweep:
    valid = set(flag_names) | set(HARDWARE_KEYS)
    measures = tuple(measures)
    unknown = sorted(set(data) - {"measure", "base", "grid"})
    if unknown:
        raise UsageError(f"{where}: unknown top-level key {unknown[0]!r}; valid: measure, base, grid")
    measure = data.get("measure", measures[0])
    if measure not in measures:
        raise UsageError(f"{where}: measure = {measure!r}; valid: {', '.join(measures)}")
    base = data.get("base", {})
    if not isinstance(base, dict):
        raise UsageError(f"{where}: [base] must be a table of settings")
    grids = data.get("grid", {})
    grids = [grids] if isinstance(grids, dict) else grids
    if not isinstance(grids, list) or not all(isinstance(g, dict) for g in grids):
        raise UsageError(f"{where}: [grid] must be a table, or [[grid]] an array of tables")
    for table, name in [(base, "base")] + [(g, "grid") for g in grids]:
        for key, value in table.items():
            if key not in valid:
                raise UsageError(f"{where}: [{name}] {key}: not a setting; valid: {', '.join(sorted(valid))}")
            values = value if name == "grid" else [value]
            if name == "grid" and (not isinstance(value, list) or not value):
                raise UsageError(f"{where}: [grid] {key} = {value!r}: give a non-empty list of values")
            for v in values:
                if not isinstance(v, (str, int, float, bool)):
                    raise UsageError(f"{where}: [{name}] {key} = {v!r}: values are strings, numbers or booleans")
    size = sum(math.prod(len(v) for v in grid.values()) for grid in grids or [{}])
    if size > MAX_POINTS:  # counted before any point is made
        raise UsageError(f"{where}: the grid has {size:,} points, above the {MAX_POINTS:,} one sweep evaluates; "
                         f"split it into several specs or give fewer values")
    points: dict[Point, None] = {}
    keys: dict[str, None] = dict.fromkeys(base)
    for grid in grids or [{}]:
        keys.update(dict.fromkeys(grid))
        names = list(grid)
        for combo in itertools.product(*(grid[k] for k in names)):
            settings = dict(base)
            settings.update(zip(names, combo))
            points[Point(tuple(settings.items()))] = None
    return Sweep(measure, tuple(points), tuple(keys))
