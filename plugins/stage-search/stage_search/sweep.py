"""``stage sweep SPEC.toml``: every point of a grid, incrementally, on an executor.

The grid is the core's format (:mod:`stage_core.grid`).  Each point becomes a unit (see
:mod:`.units`); finished units are kept in a cache folder as ``<unit id>.json``
(:class:`stage_core.unitcache.UnitCache`), so a rerun evaluates only new or changed points.  The
table lists every point of the spec, in spec order, cached or not.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from stage_core.api import Progress, UnitCache, UsageError, add_quiet_flag, code_versions, grid, setting_names, unit_id

from . import table, units

HELP = "evaluate a grid of models x plans x hardware (SPEC.toml) into one table, incrementally"


def plan_flag_names() -> tuple[str, ...]:
    """The settings a grid may name: ``stage report``'s model and plan flags, without dashes
    (strategy options of installed plugins included)."""
    return tuple(n for n in setting_names(units._host()) if n != "max-nodes")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC.toml", help="the grid: [base] settings and [grid] lists")
    p.add_argument("-o", "--output", default="sweep.csv", metavar="FILE",
                   help=f"the table ({', '.join(table.FORMATS)}; default sweep.csv)")
    p.add_argument("--executor", default="local", help="where units run (see `stage plugins`; default local)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="parallel units for the local executor (default: every core)")
    p.add_argument("--address", default=None, metavar="ADDR",
                   help="cluster address for executors that take one (ray: default $RAY_ADDRESS or a local instance)")
    p.add_argument("--cache", default=".stage-sweep", metavar="DIR",
                   help="finished units, by content (default ./.stage-sweep)")
    p.add_argument("--fresh", action="store_true", help="evaluate every point again, ignoring the cache")
    p.add_argument("--force", action="store_true",
                   help="replace -o FILE even if no sweep wrote it (never a device, a link or the spec)")
    p.add_argument("--simulator", default=None, metavar="NAME",
                   help="with measure = \"simulate\": the simulator of the stage_simulators hook (astrasim, "
                        "astrasim-aware, astrasim-htsim...; default: the first installed)")
    add_quiet_flag(p)


def plan_units(sweep: grid.Sweep, simulator: str | None = None) -> list[dict]:
    vers = code_versions(units._host())
    extra = {"simulator": simulator} if simulator else {}  # (unit ids without one stay what they were)
    return [{"flags": p.flags(), "hardware": p.hardware(), "measure": sweep.measure, "versions": vers, **extra}
            for p in sweep.points]


def run(args: argparse.Namespace) -> int:
    return run_sweep(Path(args.spec), Path(args.output), executor=args.executor, workers=args.workers,
                     address=args.address, cache=Path(args.cache), fresh=args.fresh, force=args.force,
                     simulator=args.simulator,
                     progress=Progress.for_args(args))


def run_sweep(spec_path: Path, output: Path, *, executor: str = "local", workers: int | None = None,
              address: str | None = None, cache: Path = Path(".stage-sweep"), fresh: bool = False,
              force: bool = False, err=None, simulator: str | None = None,
              progress: Progress | None = None) -> int:
    err = err or sys.stderr
    progress = progress or Progress("off")
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers}: must be 1 or more")
    rule = dict(inputs=[spec_path], force=force)
    table.check_path(output, **rule)  # before any work
    sweep = grid.load(spec_path, plan_flag_names(), units.MEASURES)
    if simulator is not None:
        if sweep.measure != "simulate":
            raise UsageError(f"--simulator {simulator}: {spec_path} measures {sweep.measure!r}; the simulator runs "
                             "with measure = \"simulate\"")
        units._host().simulator(simulator)  # a name no plugin registers: refused before any work
    runner = units._host().executor(executor, {"workers": workers, "address": address})
    store = UnitCache(cache)
    todo_units = plan_units(sweep, simulator)
    ids = [unit_id(u) for u in todo_units]
    rows: dict[int, dict] = {}
    if not fresh:
        for i, uid in enumerate(ids):
            got = _cached_row(store.read_json(uid), units.COLUMNS[sweep.measure])
            if got is not None:
                rows[i] = got
    todo = [i for i in range(len(ids)) if i not in rows]
    print(f"{len(ids)} points: {len(ids) - len(todo)} cached, {len(todo)} to evaluate on {executor}", file=err)
    start = time.perf_counter()
    # never more processes than points to evaluate
    options = {"workers": None if workers is None else min(workers, max(1, len(todo))), "address": address}
    with progress.phase(f"evaluating on {executor}", len(todo), "points") as done:
        for k, row in runner.run(units.evaluate, [todo_units[i] for i in todo], options):
            i = todo[k]
            rows[i] = row
            if row.get("status") != "failed":  # (a failed point is tried again by the next run)
                store.write_json(ids[i], {"unit": todo_units[i], "row": row})
            done(1)
    table_rows = []
    for i, point in enumerate(sweep.points):
        table_rows.append({"unit": ids[i][:16], **point.as_dict(), **rows[i]})
    table.write(output, ("unit", *sweep.keys, *units.COLUMNS[sweep.measure]), table_rows, **rule)
    counts = Counter(r["status"] for r in table_rows)
    others = "".join(f", {n} {status}" for status, n in sorted(counts.items()) if status not in ("ok", "invalid"))
    print(f"wrote {output}: {len(table_rows)} rows ({counts['ok']} ok, {counts['invalid']} invalid plans{others}) "
          f"in {time.perf_counter() - start:.2f} s", file=err)
    return 0


def _cached_row(data, columns) -> dict | None:
    """A finished unit's row; None (evaluate again) when absent, damaged, or an evaluated row
    without a column this version fills (cached before the column was added)."""
    row = data.get("row") if isinstance(data, dict) else None
    if not isinstance(row, dict):
        return None
    if row.get("status") == "ok" and any(c not in row for c in columns if c != "error"):
        return None
    return row
