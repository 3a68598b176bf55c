"""A sweep's unit of work: one point, evaluated in any process, named by its content.

A unit is plain data (``{"flags": [...], "hardware": {...}, "measure": ...,
"versions": {...}}``); its id is the SHA-256 of its canonical JSON, so the same
point under the same code versions is never evaluated twice, whichever executor
ran it and wherever.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any

from stage_core.errors import UsageError

#: what a point can compute
MEASURES = ("report",)

#: result columns of a unit, in table order
COLUMNS = ("status", "world_size", "rank_classes", "memory_bytes", "flops_per_gpu", "matmul_flops_per_step",
           "comm_bytes_per_gpu", "error")


def unit_id(unit: dict[str, Any]) -> str:
    text = json.dumps(unit, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@lru_cache(maxsize=1)
def _host():
    from stage_core.plugins import PluginHost

    return PluginHost()


@lru_cache(maxsize=1)
def _report_parser():
    from stage_core.cli import build_parser

    return build_parser(None)


def evaluate(unit: dict[str, Any]) -> dict[str, Any]:
    """The row of one unit.  A plan the core refuses is a row with status "invalid"."""
    from stage_core.api import plan_job
    from stage_core.cli import plan_from_args

    try:
        args = _report_parser().parse_args(["report", *unit["flags"]])
        model, overrides, plan, _ = plan_from_args(args)
        result = plan_job(_host(), model, overrides, plan)
    except UsageError as exc:
        return {"status": "invalid", "error": str(exc)}
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
        "comm_bytes_per_gpu": max(sum(c["comm_bytes"].values()) for c in classes),
        "error": "",
    }
