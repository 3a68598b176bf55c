"""report extrapolates a large micro-batch count from three small lowerings (stage_core.bounds):
the result equals the full lowering for every schedule and strategy, and the activation
peak follows each schedule's published in-flight count."""

import pytest
from stage_core.api import Plan, plan_job

PLANS = [
    Plan(dp=2, micro_batches=29),
    Plan(pp=2, micro_batches=41),
    Plan(pp=2, schedule="gpipe", micro_batches=33),
    Plan(pp=2, virtual_stages=2, schedule="interleaved", micro_batches=40),
    Plan(dp=2, zero=3, recompute="full", micro_batches=37),
    Plan(dp=2, zero=1, pp=2, recompute="selective", micro_batches=31),
    Plan(tp=2, sp=True, pp=2, micro_batches=50),
    Plan(cp=2, cp_comm="all-gather", micro_batches=21),
    Plan(cp=2, cp_comm="a2a", dp=2, zero=2, micro_batches=19),
]


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_the_extrapolated_report_equals_the_full_lowering(host, plan):
    fast = plan_job(host, "toy", {"layers": "4"}, plan, programs=False)
    assert fast.job.programs == []  # extrapolated
    full = plan_job(host, "toy", {"layers": "4"}, plan)
    assert fast.manifest == full.manifest
    assert [r.nodes for r in fast.reports] == [len(p.nodes) for p in full.job.programs]


def test_the_peak_saturates_for_1f1b_and_grows_for_gpipe(host):
    def activations(schedule, m):
        plan = Plan(pp=2, schedule=schedule, micro_batches=m)
        result = plan_job(host, "toy", {"layers": "4"}, plan, programs=False)
        return result.manifest["rank_classes"][0]["memory_bytes"]["activations"]

    one = activations("gpipe", 1)  # one micro-batch of stage 0's layers
    # 1F1B: stage 0 of 2 keeps at most 2 micro-batches in flight (Narayanan et al. 2021)
    assert activations("1f1b", 100_000) == 2 * one
    # GPipe keeps every micro-batch until the backward pass (Huang et al. 2019)
    assert activations("gpipe", 100_000) == 100_000 * one
