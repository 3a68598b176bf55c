"""The ``replay`` estimator (the ``stage_estimators`` hook): what ``stage estimate`` prints,
for other plugins (``stage dataset`` labels its graphs with it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from stage_core.api import UsageError
from stage_core.records import HardwareSpec

from .estimate import estimate_job
from .estimate_command import summarize

DESCRIPTION = "the rank-class programs replayed under ASTRA-sim's issue rules, analytical network (stage estimate)"


def estimate(result, hw: HardwareSpec) -> dict[str, Any]:
    """``stage estimate``'s summary of ``result`` on ``hw`` (step_time_s, mfu, exposed_comm_s,
    rank_classes ...) and, per rank class, when each node starts and finishes (seconds)."""
    if result.plan.task == "serve":
        raise UsageError("--task serve: the replay estimator times one program per rank class; estimate each "
                         "side (--task prefill, --task decode) on its own")
    est = estimate_job(result.job, hw)
    out = summarize(result, est, hw)
    out["node_start_s"] = [np.asarray(times, dtype=np.float64) * 1e-9 for times in est.issued_ns]
    out["node_finish_s"] = [np.asarray(times, dtype=np.float64) * 1e-9 for times in est.done_ns]
    return out
