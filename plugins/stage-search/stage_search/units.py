"""A sweep's unit of work: one point, evaluated in any process, named by its content.

A unit is plain data (``{"flags": [...], "hardware": {...}, "measure": ...,
"versions": {...}}``); its id is the SHA-256 of its canonical JSON
(:func:`stage_core.unitcache.unit_id`), so the same point under the same code versions
is never evaluated twice, whichever executor ran it and wherever.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from stage_core.api import StageError, UsageError, scratch_folder

#: what a point can compute: the report's costs; the step time estimated on a GPU (the
#: replay of ``stage estimate``); the step time in a simulator of ``stage_simulators``
MEASURES = ("report", "estimate", "simulate")

#: result columns of a unit, in table order, per measure
_REPORT = ("status", "world_size", "rank_classes", "memory_bytes", "flops_per_gpu", "matmul_flops_per_step",
           "comm_bytes_per_gpu", "wire_bytes_per_gpu")
COLUMNS = {
    "report": _REPORT + ("error",),
    "estimate": _REPORT + ("hardware", "compute_model", "step_time_s", "mfu", "model_tflops_per_gpu",
                           "hardware_tflops_per_gpu", "exposed_comm_s", "error"),
    "simulate": _REPORT + ("hardware", "compute_model", "step_time_s", "simulated_step_time_s", "finished", "error"),
}
#: the GPU a point is timed on when it names none (``system`` or ``gpu``)
DEFAULT_GPU = "h100"


@lru_cache(maxsize=1)
def _host():
    from stage_core.api import PluginHost

    return PluginHost()


def evaluate(unit: dict[str, Any]) -> dict[str, Any]:
    """The row of one unit, whatever happens to it: a plan the core refuses is a row with
    status "invalid"; a point that fails on the way (a plugin's fault, a set the
    validator refuses, a bug) one with status "failed" and the reason, so the sweep goes
    on with its other points."""
    try:
        return _evaluate(unit)
    except UsageError as exc:
        return {"status": "invalid", "error": str(exc)}
    except StageError as exc:
        return {"status": "failed", "error": str(exc)}
    except Exception as exc:  # a bug: one point's row says so, the others still run
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc} (a bug in STAGE or a plugin; "
                                             f"stage report with this point's flags shows where)"}


def _evaluate(unit: dict[str, Any]) -> dict[str, Any]:
    from stage_core.api import hardware
    from stage_core.api import plan_job
    from stage_core.api import plan_from_flags

    measure = unit.get("measure", "report")
    hw = None
    try:
        req = plan_from_flags(unit["flags"], _host())
        model, overrides, plan = req.model, req.overrides, req.plan
        if measure != "report":
            name = unit["hardware"].get("system") or req.gpu or DEFAULT_GPU
            hw = hardware.resolve(_host(), name, "system")
        result = plan_job(_host(), model, overrides, plan, hw, programs=measure != "report")
    except UsageError as exc:
        return {"status": "invalid", "error": str(exc)}
    row = _report_row(result)
    if measure == "report":
        return row
    from .estimate import estimate_job
    from .estimate_command import summarize

    est = summarize(result, estimate_job(result.job, hw), hw)
    row.update(hardware=hw.name, compute_model=est["compute_model"], step_time_s=est["step_time_s"])
    if measure == "estimate":
        row.update(mfu=est["mfu"], model_tflops_per_gpu=est["model_tflops_per_gpu"],
                   hardware_tflops_per_gpu=est["hardware_tflops_per_gpu"], exposed_comm_s=est["exposed_comm_s"])
        return row
    row.update(_simulated(result, hw, unit.get("simulator")))
    return row


def _simulated(result, hw, name: str | None = None) -> dict[str, Any]:
    """The simulator's step of ``result``'s set, written to a temporary folder."""
    from stage_core.api import write_trace_set

    host = _host()
    simulators = [s for s in host.simulators() if name is None or s.name == name]
    if not simulators:
        return {"status": "not simulated", "error": "no simulator is installed (install stage-adapter-astrasim)"}
    simulator = simulators[0]
    reason = simulator.available()
    if reason:
        return {"status": "not simulated", "error": f"{simulator.name}: {reason}"}
    with scratch_folder("sweep") as tmp:  # (a killed sweep's folder goes at the next one)
        try:
            write_trace_set(host, result, tmp / "set")
            got = simulator.simulate(tmp / "set", hw)
        except UsageError as exc:  # a set this simulator cannot take (one rank, say): a row, not the sweep's end
            return {"status": "not simulated", "error": f"{simulator.name}: {exc}"}
    return {"simulated_step_time_s": got["step_time_s"], "finished": bool(got["finished"])}


def _report_row(result) -> dict[str, Any]:
    classes = result.manifest["rank_classes"]
    return {
        "status": "ok",
        "world_size": result.manifest["world_size"],
        "rank_classes": len(classes),
        # per GPU, per step: the busiest rank class
        "memory_bytes": max(c["memory_bytes"]["total"] for c in classes),
        "flops_per_gpu": max(c["flops"]["total"] for c in classes),
        # the whole job's matmul FLOPs (Megatron's model-FLOPs convention counts these)
        "matmul_flops_per_step": sum(c["flops"]["matmul"] * len(c["ranks"]) for c in classes),
        # what the collectives name (their comm_size, sends and receives), and what the busiest rank
        # sends on its link (ring algorithm; stage report's "wire sent")
        "comm_bytes_per_gpu": max(sum(c["comm_bytes"].values()) for c in classes),
        "wire_bytes_per_gpu": max(sum(v for k, v in c.get("wire_bytes", {}).items() if k != "recv") for c in classes),
        "error": "",
    }
