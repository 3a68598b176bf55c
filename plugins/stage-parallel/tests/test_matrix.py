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
] + [
    Plan(pp=2, dp=dp, tp=tp, sp=tp > 1, zero=zero, recompute=rc, micro_batches=4, schedule=schedule,
         virtual_stages=2 if schedule == "interleaved" else 1)
    for dp, tp, zero, rc, schedule in itertools.product((1, 2), (1, 2), (0, 1, 3), ("none", "full"),
                                                        ("1f1b", "gpipe", "interleaved"))
    if not (zero and dp == 1)
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
    f"dp{p.dp}-tp{p.tp}{'-sp' if p.sp else ''}-pp{p.pp}{'-' + p.schedule if p.pp > 1 else ''}"
    f"-z{p.zero}-{p.recompute}-m{p.micro_batches}"))
def test_flops_add_up_and_the_set_validates(traces, plan):
    layers = {"layers": "4"} if plan.virtual_stages > 1 else {}
    result, ts, ranks = traces(plan, overrides=layers)  # written, validated before the rename, read back
    assert ts.world_size == plan.world_size == len(ranks)
    classes = result.manifest["rank_classes"]
    assert sorted(r for rc in classes for r in rc["ranks"]) == list(range(plan.world_size))
    assert len(classes) == plan.pp  # one program per pipeline stage
    total = sum(rc["flops"]["matmul"] * len(rc["ranks"]) for rc in classes)
    assert total == single_device_matmul(result)
    # what the traces say equals what the manifest says
    for rank, nodes in ranks.items():
        rc = next(c for c in classes if rank in c["ranks"])
        moved = sum(n.attr("comm_size") for n in nodes if n.type in (5, 6, 7))
        assert moved == sum(v for v in rc["comm_bytes"].values())
