"""The fully connected family (stage-model-mlp) with the standard strategies and in the real ASTRA-sim.

Das et al. 2016's hybrid for a network of fully connected layers is model parallel within groups
(``--tp``) and data parallel across them (``--dp``): the layers alternate column and row parallel,
so each rank computes its share of every product and the collectives are the row-parallel outputs
and the column-parallel input gradients (tensor parallel) and the gradients (data parallel), each
counted here by hand; a small case must finish on every rank in the simulator, on the paper's own
cluster too (one rank a node: one network dimension of the nodes), where ASTRA-sim's step is the
estimate's.
"""

import pytest

from stage_core import hardware
from stage_core.flow import plan_job, write_trace_set
from stage_core.parallel import Plan
from stage_core.testing import one_device_matmul_flops, ranks_matmul_flops
from test_simulator import finishes

SMALL = {"layers": 3, "hidden": 256, "inputs": 39, "classes": 100}


def test_hybrid_dnn_finishes_on_every_rank(write_set, replay_and_simulate):
    plan = Plan(tp=2, dp=2, micro_batch_size=8, grad_dtype="fp32")
    finishes(replay_and_simulate(write_set("das2016-dnn", plan, **SMALL)), plan.world_size)


def test_hybrid_dnn_on_das2016_fdr_finishes_as_estimated(host, simulate, tmp_path):
    from stage_search.estimate import estimate_job

    hw = hardware.resolve(host, "das2016-fdr")
    plan = Plan(tp=2, dp=2, micro_batch_size=8, grad_dtype="fp32")
    result = plan_job(host, "das2016-dnn", {k: str(v) for k, v in SMALL.items()}, plan, hw)
    write_trace_set(host, result, tmp_path / "set")
    status, results = simulate(tmp_path / "set", system="das2016-fdr")
    assert status == 0 and results["summary"]["finished_ranks"] == 4
    assert results["summary"]["max_finish_time_ns"] == pytest.approx(estimate_job(result.job, hw).step_ns, rel=0.01)


def test_hybrid_dnn_shards_every_layer_and_reduces_by_hand(host):
    b, i, h, c = 256, 429, 2048, 9304
    result = plan_job(host, "das2016-dnn", {}, Plan(tp=2, dp=2, micro_batch_size=b, grad_dtype="fp32"),
                      programs=False)
    sharded = {p.name for p, layout in result.sharded.param_compute.items() if "tp" in layout}
    column = {f"fc{j}.{k}" for j in (1, 3, 5, 7) for k in ("weight", "bias")}
    row = {f"fc{j}.weight" for j in (2, 4, 6)} | {"output.weight"}
    assert sharded == column | row  # the row-parallel layers' biases stay whole on every tp rank
    assert ranks_matmul_flops(result) == one_device_matmul_flops(result)
    # tensor parallel, fp32: forward all-reduces the outputs of fc2, fc4, fc6 [b, h] and the logits [b, c];
    # backward the input gradients of fc3, fc5, fc7 [b, h] (fc1's input, the features, needs none)
    tp = 4 * b * (3 * h + c) + 4 * b * 3 * h
    # data parallel, fp32 gradients: what each rank holds of the parameters
    held = (i * h // 2 + h // 2) + 3 * (h * h // 2 + h) + 3 * (h * h // 2 + h // 2) + (c * h // 2 + c)
    assert held == 22_569_048
    assert result.manifest["rank_classes"][0]["comm_bytes"]["all_reduce"] == tp + 4 * held == 112_386_400
