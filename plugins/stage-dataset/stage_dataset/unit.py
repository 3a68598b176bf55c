"""One point of a dataset's grid, evaluated in any process: its plan's graphs and their label.

A unit is plain data (``{"flags": [...], "hardware": {...}, "measure": ...,
"dataset": {"granularity", "max_nodes", "node_times", "estimator"}, "versions": {...}}``),
named by :func:`stage_core.api.unit_id`.  :func:`evaluate` plans the point on its GPU
(every kernel timed by the GPU's compute model), labels it with an estimator of the
``stage_estimators`` hook (``measure = "estimate"``) or a simulator of
``stage_simulators`` (``measure = "simulate"``), and cuts its rank programs into graphs
(:mod:`.graphs`).  The result is plain data too: a few numbers and strings (``meta``)
and numpy arrays, what the cache keeps as one ``.npz`` per unit.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import numpy as np

from stage_core.api import PluginHost, UsageError, hardware, plan_from_flags, plan_job

from .graphs import program_graphs

#: what labels a point: an estimator of the stage_estimators hook, or a simulator's run of its set
MEASURES = ("estimate", "simulate")
#: the GPU a point is timed on when it names none (``system`` or ``gpu``)
DEFAULT_GPU = "h100"
#: the plan as index.csv shows it: (column, manifest plan key)
PLAN_COLUMNS = (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"), ("sp", "sp"),
                ("zero", "zero"), ("recompute", "recompute"), ("schedule", "schedule"),
                ("virtual-stages", "virtual_stages"), ("micro-batches", "micro_batches"),
                ("micro-batch-size", "micro_batch_size"), ("seq-len", "seq_len"), ("task", "task"))


@lru_cache(maxsize=1)
def _host() -> PluginHost:
    return PluginHost()


def evaluate(unit: dict[str, Any]) -> dict[str, Any]:
    """``{"meta": {...}, "arrays": {...}}`` of one unit; a plan the core refuses is status
    ``invalid`` with the reason, a point no simulator can run ``not simulated``."""
    host = _host()
    options = unit["dataset"]
    try:
        req = plan_from_flags(unit["flags"], host)
        name = unit["hardware"].get("system") or req.gpu or DEFAULT_GPU
        hw = hardware.resolve(host, name, "system")
        result = plan_job(host, req.model, req.overrides, req.plan, hw)
    except UsageError as exc:
        return {"meta": {"status": "invalid", "error": str(exc)}, "arrays": {}}
    starts = finishes = None
    try:
        if unit["measure"] == "estimate":
            got = host.estimator(options["estimator"]).estimate(result, hw)
            starts, finishes = got.get("node_start_s"), got.get("node_finish_s")  # for graph_time
            if options["node_times"] and (starts is None or finishes is None):
                raise UsageError(f"--node-times: estimator {options['estimator']} gives no node times")
        else:
            got = _simulated(host, result, hw)
            if "status" in got:
                return {"meta": got, "arrays": {}}
    except UsageError as exc:
        return {"meta": {"status": "invalid", "error": str(exc)}, "arrays": {}}
    graphs = program_graphs(result.job, options["granularity"], options["max_nodes"], starts, finishes)
    plan = result.manifest["plan"]
    meta = {"status": "ok", "error": "", "step_time_s": float(got["step_time_s"]), "hardware": hw.name,
            "model": result.config.name, "world_size": result.manifest["world_size"],
            "plan": {col: plan.get(key) for col, key in PLAN_COLUMNS},
            "categories": graphs.categories, "too_large": graphs.too_large}
    return {"meta": meta, "arrays": graphs.arrays(bool(options["node_times"]))}


def _simulated(host: PluginHost, result, hw) -> dict[str, Any]:
    """The step of ``result``'s set in the first simulator of ``stage_simulators`` that can run
    here, written to a temporary folder; ``{"status": "not simulated", ...}`` when none can."""
    import shutil
    import tempfile
    from pathlib import Path

    from stage_core.api import write_trace_set

    simulators = host.simulators()
    if not simulators:
        return {"status": "not simulated", "error": "no simulator is installed (install stage-adapter-astrasim)"}
    reasons = [f"{s.name}: {s.available()}" for s in simulators if s.available()]
    ready = [s for s in simulators if not s.available()]
    if not ready:
        return {"status": "not simulated", "error": "; ".join(reasons)}
    simulator = ready[0]
    tmp = Path(tempfile.mkdtemp(prefix="stage-dataset-"))
    try:
        write_trace_set(host, result, tmp / "set", workers=1)
        got = simulator.simulate(tmp / "set", hw)
    except UsageError as exc:
        return {"status": "not simulated", "error": f"{simulator.name}: {exc}"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not got.get("finished"):
        return {"status": "not simulated", "error": f"{simulator.name}: not every rank finished"}
    return {"step_time_s": got["step_time_s"]}


# --------------------------------------------------------------------------- the cache's form


def save(f, evaluated: dict[str, Any]) -> None:
    """Write an evaluated unit to the open binary file ``f`` (an .npz: the arrays and ``meta`` as JSON)."""
    np.savez(f, meta=np.asarray(json.dumps(evaluated["meta"], sort_keys=True)), **evaluated["arrays"])


def load(path) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        arrays = {k: data[k] for k in data.files if k != "meta"}
    if not isinstance(meta, dict) or "status" not in meta:
        raise ValueError(f"{path}: not an evaluated unit")
    return {"meta": meta, "arrays": arrays}
