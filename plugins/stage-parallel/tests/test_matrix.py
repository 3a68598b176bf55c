"""Every combination of the strategies: FLOPs add up to the single-device step, and the
written trace set passes validation."""

import itertools

import pytest

from stage_core import sym
from stage_core.parallel import Plan

COMBOS = [
    Plan(dp=dp, tp=tp, sp=sp, zero=zero, recompute=rc, micro_batches=m)
    for dp, tp, sp, zero, rc, m in itertools.product((1, 2), (1, 2), (False, True), (0, 1, 2, 3),
                                                    ("none", "selective", "full"), (1, 2))
    if not (sp and tp == 1) and not (zero and dp == 1)
]


def single_device_matmul(result):
    """Matmul FLOPs of the whole step on one device, from the training graph itself."""
    train, plan = result.training, result.plan
    values = dict(train.dims, b=plan.micro_batch_size * plan.dp, s=plan.seq_len)
    fwd = [op for op in train.forward_ops if op.is_kernel]
    bwd = [op for op in train.backward_ops if op.is_kernel]
    recomputed = {"none": [], "full": [op for op in fwd if op.layer is not None],
                  "selective": [op for op in fwd if op.block == "attn_core"]}[plan.recompute]
    exprs = [op.matmul_flops for op in fwd + bwd + recomputed]
    return plan.micro_batches * sum(sym.Evaluator(exprs)(values))


@pytest.mark.parametrize("plan", COMBOS, ids=lambda p: (
    f"dp{p.dp}-tp{p.tp}{'-sp' if p.sp else ''}-z{p.zero}-{p.recompute}-m{p.micro_batches}"))
def test_flops_add_up_and_the_set_validates(traces, plan):
    result, ts, ranks = traces(plan)  # written, validated before the rename, read back
    assert ts.world_size == plan.world_size == len(ranks)
    (rc,) = result.manifest["rank_classes"]
    assert len(rc["ranks"]) == plan.world_size
    total = rc["flops"]["matmul"] * plan.world_size
    assert total == single_device_matmul(result)
    # what the traces say equals what the manifest says
    for rank, nodes in ranks.items():
        comm = sum(n.attr("comm_size") for n in nodes if n.type == 7)
        assert comm == sum(v for v in rc["comm_bytes"].values())
