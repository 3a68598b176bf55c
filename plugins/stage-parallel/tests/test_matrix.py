"""Every combination of the strategies: FLOPs add up to the single-device step, the
written trace set passes validation, and the replay of ASTRA-sim's issue rules proves
that every rank finishes whatever the timing (docs/design.md, "The one communication
slot")."""

import pytest

from stage_core.api import examine_trace_set as examine
from stage_core.testing import matrix_overrides, one_device_matmul_flops, plan_id, ranks_matmul_flops, strategy_matrix

COMBOS = strategy_matrix()


@pytest.mark.parametrize("plan", COMBOS, ids=plan_id)
def test_flops_add_up_and_the_set_validates(traces, plan):
    # written, validated before the rename, read back
    result, ts, ranks = traces(plan, overrides=matrix_overrides(plan))
    assert ts.world_size == plan.world_size == len(ranks)
    report = examine(ts)
    assert report.problems == []
    # sends and collectives chained on every rank, so the verdict holds for any timing
    assert report.verdict.finishes and report.verdict.timing_independent
    assert report.verdict.per_class and report.verdict.processes == plan.pp
    classes = result.manifest["rank_classes"]
    assert sorted(r for rc in classes for r in rc["ranks"]) == list(range(plan.world_size))
    assert len(classes) == plan.pp  # one program per pipeline stage
    total = sum(rc["flops"]["matmul"] * len(rc["ranks"]) for rc in classes)
    assert total == ranks_matmul_flops(result) == one_device_matmul_flops(result)
    # what the traces say equals what the manifest says
    for rank, nodes in ranks.items():
        rc = next(c for c in classes if rank in c["ranks"])
        moved = sum(n.attr("comm_size") for n in nodes if n.type in (5, 6, 7))
        assert moved == sum(v for v in rc["comm_bytes"].values())
