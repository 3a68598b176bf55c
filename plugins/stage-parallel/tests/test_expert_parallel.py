"""The ep strategy's checks (the MoE numbers are in tests/integration/test_moe_parallel.py)."""

import pytest

from stage_core.api import Plan, UsageError, plan_job


@pytest.mark.parametrize("plan", [Plan(dp=2, ep=2), Plan(tp=2, etp=1, sp=True)])
def test_expert_parallel_needs_routed_experts(host, plan):
    with pytest.raises(UsageError, match="needs a mixture-of-experts model; toy has no routed experts"):
        plan_job(host, "toy", {}, plan)


def test_the_expert_view_keeps_the_pipeline_stages():
    # Megatron-Core: with pp before dp in the order, edp must equal dp (checked for MoE
    # models only: a dense model has no expert layers, Llama 3's order takes any cp)
    from stage_core.api import Mesh

    assert not Mesh.from_plan(Plan(dp=4, ep=4, pp=2, order="tp-cp-ep-pp-dp")).expert_stages_match
    mesh = Mesh.from_plan(Plan(dp=4, ep=2, pp=2, order="tp-cp-ep-pp-dp", etp=1, tp=2, sp=True))
    assert mesh.degrees["edp"] == 4 and mesh.expert.strides["pp"] == mesh.strides["pp"] == 2
    assert mesh.expert_stages_match
