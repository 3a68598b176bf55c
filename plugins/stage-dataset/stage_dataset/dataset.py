"""``stage dataset GRID.toml -o DIR``: the rank programs of every plan of a grid as graphs,
labelled with the plan's step time, in LayerDAG's layout.

Every point of the grid (the core's format, :mod:`stage_core.grid`) is a unit
(:mod:`.unit`) run on an executor of the ``stage_executors`` hook; finished units are
kept in ``--cache`` as ``<unit id>.npz`` (:class:`stage_core.api.UnitCache`), so a rerun
takes them from there.  The points are split into train, validation and test *by
plan* (seeded; the same plan on other hardware goes with it), and each split written
as one ``.npz`` (:mod:`.files`), with ``categories.json``, ``index.csv`` and
``summary.json`` beside them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from stage_core.api import UnitCache, UsageError, code_versions, grid, setting_names, unit_id

from . import files, unit
from .graphs import GRANULARITIES

HELP = "the rank programs of a grid of plans as graphs labelled with their step times (LayerDAG-style .npz)"
SPLITS = ("train", "val", "test")
DEFAULT_SPLIT = "0.8,0.1,0.1"
DEFAULT_MAX_NODES = 400  # LayerDAG's largest graphs (Li et al. 2025) have about 400 nodes


def plan_flag_names(host) -> tuple[str, ...]:
    """The settings a point may have: ``stage report``'s model and plan flags without dashes
    (``--max-nodes`` is this command's own: the largest graph)."""
    return tuple(n for n in setting_names(host) if n != "max-nodes")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("grid", metavar="GRID.toml", help="the plans: [base] settings and [grid] lists, as stage sweep reads")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="the dataset folder: train/val/test.npz, categories.json, index.csv, summary.json")
    p.add_argument("--granularity", choices=GRANULARITIES, default="segment",
                   help="a graph per rank class's step, per schedule step (micro-batch x chunk x phase, and the "
                        "tail of gradient reductions and optimizer), or per layer of those (default segment)")
    p.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES, metavar="N",
                   help=f"leave out graphs of more nodes, counting them (default {DEFAULT_MAX_NODES})")
    p.add_argument("--split", default=DEFAULT_SPLIT, metavar="TRAIN,VAL,TEST",
                   help=f"shares of the plans in each split (default {DEFAULT_SPLIT})")
    p.add_argument("--seed", type=int, default=0, help="the split's seed (default 0)")
    p.add_argument("--node-times", action="store_true",
                   help="add each node's start and finish in the estimator's replay (node_start, node_finish)")
    p.add_argument("--estimator", default="replay", metavar="NAME",
                   help="what labels the graphs when measure = \"estimate\" (see `stage plugins`; default replay)")
    p.add_argument("--pth", action="store_true",
                   help="also write LayerDAG's own train/val/test.pth (needs torch: pip install 'stage-dataset[torch]')")
    p.add_argument("--executor", default="local", help="where units run (see `stage plugins`; default local)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="parallel units for the local executor (default: every core)")
    p.add_argument("--address", default=None, metavar="ADDR", help="cluster address for executors that take one")
    p.add_argument("--cache", default=".stage-dataset", metavar="DIR",
                   help="finished units, by content (default ./.stage-dataset)")
    p.add_argument("--fresh", action="store_true", help="evaluate every point again, ignoring the cache")


def run(args: argparse.Namespace) -> int:
    return build(Path(args.grid), Path(args.output), granularity=args.granularity, max_nodes=args.max_nodes,
                 split=args.split, seed=args.seed, node_times=args.node_times, estimator=args.estimator,
                 pth=args.pth, executor=args.executor, workers=args.workers, address=args.address,
                 cache=Path(args.cache), fresh=args.fresh)


def parse_split(text: str) -> tuple[float, float, float]:
    parts = text.split(",")
    try:
        shares = tuple(float(x) for x in parts)
    except ValueError:
        shares = ()
    if len(shares) != 3 or not all(math.isfinite(s) and s >= 0 for s in shares) or shares[0] <= 0 \
            or not math.isclose(sum(shares), 1.0, abs_tol=1e-9):
        raise UsageError(f"--split {text}: give three shares TRAIN,VAL,TEST, each 0 or more, TRAIN above 0, "
                         f"adding up to 1 (e.g. {DEFAULT_SPLIT})")
    return shares  # type: ignore[return-value]


def split_plans(keys: Sequence[str], shares: tuple[float, float, float], seed: int) -> list[str]:
    """The split of each point: points of one plan (``keys`` equal) together, plans shuffled
    with ``seed`` and dealt out by ``shares`` (validation and test rounded, train the rest)."""
    plans = list(dict.fromkeys(keys))
    order = np.random.default_rng(seed).permutation(len(plans))
    n_val = int(round(shares[1] * len(plans)))
    n_test = int(round(shares[2] * len(plans)))
    n_train = max(len(plans) - n_val - n_test, 0)
    which = {}
    for rank, i in enumerate(order.tolist()):
        which[plans[i]] = "train" if rank < n_train else "val" if rank < n_train + n_val else "test"
    return [which[k] for k in keys]


def build(grid_path: Path, output: Path, *, granularity: str = "segment", max_nodes: int = DEFAULT_MAX_NODES,
          split: str = DEFAULT_SPLIT, seed: int = 0, node_times: bool = False, estimator: str = "replay",
          pth: bool = False, executor: str = "local", workers: int | None = None, address: str | None = None,
          cache: Path = Path(".stage-dataset"), fresh: bool = False, err=None) -> int:
    err = err or sys.stderr
    start = time.perf_counter()
    host = unit._host()
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers}: must be 1 or more")
    if max_nodes < 1:
        raise UsageError(f"--max-nodes {max_nodes}: must be 1 or more")
    if granularity not in GRANULARITIES:
        raise UsageError(f"--granularity {granularity}: valid: {', '.join(GRANULARITIES)}")
    shares = parse_split(split)
    if pth:
        files.require_torch("--pth")
    files.check_output(output)
    sweep = grid.load(grid_path, plan_flag_names(host), unit.MEASURES)
    if sweep.measure == "estimate":
        host.estimator(estimator)
    elif node_times:
        raise UsageError("--node-times: a simulator's run gives no node times; use measure = \"estimate\"")
    runner = host.executor(executor, {"workers": workers, "address": address})
    store = UnitCache(cache)
    options = {"granularity": granularity, "max_nodes": max_nodes, "node_times": node_times,
               "estimator": estimator if sweep.measure == "estimate" else None}
    versions = code_versions(host)
    units = [{"flags": p.flags(), "hardware": p.hardware(), "measure": sweep.measure, "dataset": options,
              "versions": versions} for p in sweep.points]
    ids = [unit_id(u) for u in units]
    done: dict[int, dict[str, Any]] = {}
    if not fresh:
        for i, uid in enumerate(ids):
            got = store.read(uid, ".npz", unit.load)
            if got is not None:
                done[i] = got
    todo = [i for i in range(len(ids)) if i not in done]
    cached = len(done)
    print(f"{len(ids)} points: {cached} cached, {len(todo)} to evaluate on {executor}", file=err)
    for k, result in runner.run(unit.evaluate, [units[i] for i in todo], {"workers": workers, "address": address}):
        i = todo[k]
        done[i] = result
        store.write(ids[i], ".npz", lambda f, r=result: unit.save(f, r))
    evaluated = time.perf_counter() - start

    results = [done[i] for i in range(len(ids))]
    ok = [i for i, r in enumerate(results) if r["meta"]["status"] == "ok" and len(r["arrays"]["num_nodes"])]
    which = dict(zip(ok, split_plans([json.dumps(units[i]["flags"]) for i in ok], shares, seed)))
    data = files.assemble(results, ids, sweep, which, node_times)
    counts = {s: 0 for s in ("ok", "invalid", "not simulated")}
    for r in results:
        counts[r["meta"]["status"]] = counts.get(r["meta"]["status"], 0) + 1
    sizes = np.concatenate([data.splits[s]["num_nodes"] for s in SPLITS])
    summary = {
        "grid": str(grid_path), "measure": sweep.measure, "estimator": options["estimator"],
        "granularity": granularity, "max_nodes": max_nodes, "split": list(shares), "seed": seed,
        "points": len(ids), "points_ok": counts["ok"], "points_invalid": counts["invalid"],
        "points_not_simulated": counts["not simulated"], "points_cached": cached,
        "plans": {s: len({json.dumps(units[i]["flags"]) for i in ok if which[i] == s}) for s in SPLITS},
        "graphs": {s: int(len(data.splits[s]["num_nodes"])) for s in SPLITS},
        "graphs_too_large": sum(int(r["meta"].get("too_large", 0)) for r in results),
        "nodes_per_graph": {"median": float(np.median(sizes)) if len(sizes) else 0.0,
                            "max": int(sizes.max()) if len(sizes) else 0},
        "categories": len(data.categories),
        "categories_not_in_train": [c["name"] for c in data.categories if not c["in_train"]],
        "seconds": round(time.perf_counter() - start, 3), "seconds_evaluating": round(evaluated, 3),
    }
    files.write(output, data, summary, pth)
    total = sum(summary["graphs"].values())
    print(f"wrote {output}: {total} graphs ({', '.join(f'{n} {s}' for s, n in summary['graphs'].items())}) from "
          f"{counts['ok']} plans ({counts['invalid']} invalid"
          + (f", {counts['not simulated']} not simulated" if counts["not simulated"] else "")
          + f"); nodes per graph median {summary['nodes_per_graph']['median']:g}, max "
          f"{summary['nodes_per_graph']['max']}; {len(data.categories)} categories; "
          f"{summary['graphs_too_large']} graphs over --max-nodes {max_nodes} left out; "
          f"{summary['seconds']:.2f} s", file=err)
    if summary["categories_not_in_train"]:
        print(f"note: categories only in val/test (numbered after train's): "
              f"{', '.join(summary['categories_not_in_train'])}", file=err)
    return 0
