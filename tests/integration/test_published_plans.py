"""Every published plan (`stage plans`) reports: its ranks' FLOPs add up to the step on one
device, and its first pipeline stage fits the GPU it ran on (it did run)."""

import time

import pytest

from stage_core.flow import plan_job
from stage_core.planning import plan_from_settings
from stage_core.models import evaluate_sum
from stage_core.plugins import PluginHost

HOST = PluginHost()
PLANS = [p.name for p in HOST.plans()]


def one_device(result) -> tuple[int, int]:
    """(matmul FLOPs, all FLOPs) of the whole step on one device, from the training graph:
    forward, backward and recomputed forward of every micro-batch of the global batch, and
    one optimizer step."""
    train, plan = result.training, result.plan
    values = dict(train.dims, b=plan.micro_batch_size * plan.dp, s=plan.seq_len)
    fwd = [op for op in train.forward_ops if op.is_kernel]
    bwd = [op for op in train.backward_ops if op.is_kernel]
    recomputed = {"none": [], "full": [op for op in fwd if op.layer is not None],
                  "selective": [op for op in fwd if op.block == "attn_core"]}[plan.recompute]
    ops = fwd + bwd + recomputed
    matmul = plan.micro_batches * evaluate_sum([op.matmul_flops for op in ops], values)
    total = plan.micro_batches * evaluate_sum([op.flops for op in ops], values)
    return matmul, total + evaluate_sum([op.flops for op in train.optimizer_ops], values)


def test_the_published_plans_are_there():
    assert {"llama3-405b-8k-gpus", "llama3-405b-16k-gpus", "llama3-405b-16k-gpus-128k",
            "gpt3-175b-megatron", "deepseek-v3", "mixtral-8x7b-megatron"} <= set(PLANS)


@pytest.mark.parametrize("name", PLANS)
def test_published_plan_reports_adds_up_and_fits(name):
    req = plan_from_settings({"plan": name}, HOST)
    model, overrides, plan = req.model, req.overrides, req.plan
    start = time.process_time()
    result = plan_job(HOST, model, overrides, plan, programs=False)  # what stage report runs
    assert time.process_time() - start < 120  # planning is per rank class, not per rank
    classes = result.manifest["rank_classes"]
    assert sorted(r for c in classes for r in c["ranks"]) == list(range(plan.world_size))
    matmul, total = one_device(result)
    assert sum(c["flops"]["matmul"] * len(c["ranks"]) for c in classes) == matmul
    # all kernels: within 0.5% (ranks repeat a few kernels: the optimizer of replicated
    # state, norms and the loss on every TP rank)
    assert sum(c["flops"]["total"] * len(c["ranks"]) for c in classes) == pytest.approx(total, rel=0.005)
    # the first stage holds the most activations (1F1B); it fit the GPU the plan ran on
    gpu = next(h for h in HOST.hardware() if h.name == HOST.plan(name).settings["gpu"]).gpu
    first = next(c for c in classes if 0 in c["ranks"])
    assert 0 < first["memory_bytes"]["total"] <= gpu.memory_gib * 2**30
