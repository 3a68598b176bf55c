"""Shared timing helpers for the benchmark scripts (not a test)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from stage_core.api import plan_job, write_trace_set
from stage_core.plugins import PluginHost


def time_generate(host: PluginHost, model: str, plan, *, validate: bool = True, fmt: str = "chakra") -> dict:
    """Seconds for each phase of `stage generate`, and the size of what it wrote."""
    t0 = time.perf_counter()
    result = plan_job(host, model, {}, plan)
    t1 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="stage-bench-"))
    try:
        out = tmp / "set"
        write_trace_set(host, result, out, fmt, validate=False)
        t2 = time.perf_counter()
        seconds_validate = 0.0
        if validate:
            from stage_core.api import read_trace_set
            from stage_core.validate import validate as check

            problems = check(read_trace_set(host, out))
            assert not problems, problems[:3]
            seconds_validate = time.perf_counter() - t2
        nbytes = sum(p.stat().st_size for p in out.iterdir())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    nodes = sum(len(p.nodes) * len(p.ranks) for p in result.job.programs)
    return {"plan_s": t1 - t0, "write_s": t2 - t1, "validate_s": seconds_validate,
            "total_s": t2 - t0 + seconds_validate, "ranks": result.job.world_size, "nodes": nodes, "bytes": nbytes,
            "classes": len(result.job.programs)}
