"""Bounded work (issue 9, point 4): limits checked before the work they guard, in one
line naming the value; report analytic in the number of micro-batches."""

import json

import pytest

from stage_core import hookimpl
from stage_core.flow import plan_job
from stage_core.bounds import INT64_MAX, MAX_WORLD, sample_count
from stage_core.cli import main
from stage_core.ir import builder
from stage_core.models import training_flops
from stage_core.parallel.plan import Plan
from stage_core.records import ModelSpec
from stage_core.testing import ToyConfig, build_toy, fresh_host, jsonl_plugin, toy_plugin

from conftest import DP


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"))


def run(host, capsys, *argv):
    status = main(list(argv), host=host)
    out = capsys.readouterr()
    return status, out.out, out.err.strip()


def refused(status, err, *needles):
    assert status == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def test_report_of_100000_micro_batches_is_extrapolated_exactly(host):
    result = plan_job(host, "toy", {}, Plan(dp=2, micro_batches=100_000), programs=False)
    assert result.job.programs == []  # one lowering of 4 micro-batches, nothing of 100,000
    # per rank: each micro-batch of 1 sequence through forward and backward (the optimizer
    # has no matmuls), summed by the core's exact totals of the graph
    per_micro_batch = training_flops(build_toy(ToyConfig()), b=1, s=ToyConfig().seq_len, what="matmul_flops")
    rc = result.manifest["rank_classes"][0]
    assert rc["flops"]["matmul"] == 100_000 * per_micro_batch
    one = plan_job(host, "toy", {}, Plan(dp=2, micro_batches=1), programs=False).manifest["rank_classes"][0]
    assert rc["memory_bytes"] == one["memory_bytes"]  # dp only: one micro-batch in flight at a time
    assert rc["comm_bytes"] == one["comm_bytes"]  # one gradient all-reduce per step


def test_the_extrapolation_equals_the_full_lowering(host):
    plan = Plan(dp=2, micro_batches=23)
    fast = plan_job(host, "toy", {}, plan, programs=False)
    full = plan_job(host, "toy", {}, plan)
    assert fast.job.programs == [] and full.job.programs
    assert fast.manifest == full.manifest
    assert [r.nodes for r in fast.reports] == [len(p.nodes) for p in full.job.programs]


def test_the_sample_keeps_the_micro_batches_modulo_pp():
    assert sample_count(Plan(micro_batches=4)) is None  # small: lowered as it is
    assert sample_count(Plan(micro_batches=5)) == 4
    assert sample_count(Plan(pp=4, micro_batches=100_000)) == 4
    assert sample_count(Plan(pp=4, micro_batches=99_999)) == 7
    assert sample_count(Plan(pp=8, micro_batches=100_000)) == 8  # what 8 micro-batches cost


#: every rank runs each forward kernel of the toy model once per micro-batch
KERNELS = len(build_toy(ToyConfig()).kernels())


@pytest.mark.parametrize("argv,needles", [
    # the reproducers, each refused before the work in one line
    (["--micro-batches", "1000000000"], [f"at least {2 * 10**9 * KERNELS:,} nodes", "--max-nodes 1,000,000,000",
                                         "--micro-batches (1000000000)"]),
    (["--dp", "1000000000"], ["world size 1,000,000,000", f"above the {MAX_WORLD:,} ranks"]),
    (["--set", "layers=1000000000"], ["layers=1000000000", "more than the 50,000 STAGE builds"]),
    (["--micro-batches", "40", "--max-nodes", "1000"], [f"at least {2 * 40 * KERNELS:,} nodes", "--max-nodes 1,000"]),
    (["--max-nodes", "0"], ["--max-nodes 0: must be a positive integer"]),
])
def test_generate_refuses_what_exceeds_a_limit(host, capsys, tmp_path, argv, needles):
    status, _, err = run(host, capsys, "generate", "--model", "toy", "--dp", "2", *argv, "--format", "jsonl",
                         "-o", str(tmp_path / "out"))
    refused(status, err, *needles)
    assert list(tmp_path.iterdir()) == []


def test_the_exact_node_count_is_checked_before_the_full_lowering(host, capsys, tmp_path, monkeypatch):
    import stage_core.bounds as bounds

    lowered = []
    real = bounds.lower_within

    def spy(lower, plan, max_nodes, programs=True, order=None):
        return real(lambda p: lowered.append(p.micro_batches) or lower(p), plan, max_nodes, programs, order)

    monkeypatch.setattr("stage_core.flow.lower_within", spy)
    exact = plan_job(host, "toy", {}, Plan(dp=2, micro_batches=50))
    nodes = sum(len(p.nodes) * len(p.ranks) for p in exact.job.programs)
    assert lowered == [4, 50]
    lowered.clear()
    status, _, err = run(host, capsys, "generate", "--model", "toy", "--dp", "2", "--micro-batches", "50",
                         "--max-nodes", str(nodes - 1), "--format", "jsonl", "-o", str(tmp_path / "out"))
    refused(status, err, f"would hold {nodes:,} nodes")
    assert lowered == [4]  # refused from the sample, never lowered in full


@pytest.mark.parametrize("command", ["report", "generate"])
def test_int64_overflow_is_refused_naming_the_node_and_value(host, capsys, tmp_path, command):
    # the issue: --set hidden=1000000000 passed report and crashed generate
    out = ["--format", "jsonl", "-o", str(tmp_path / "out")] if command == "generate" else []
    status, _, err = run(host, capsys, command, "--model", "toy", "--set", "hidden=1000000000", *out)
    # attn.qkv: 2 FLOPs x b s (1 x 32) x h (1e9) x 3h (3e9), plus its bias, one add per output
    h = 10**9
    qkv = 2 * 32 * h * 3 * h + 32 * 3 * h
    assert qkv > INT64_MAX
    refused(status, err, "'mb0.fwd.layers.0.attn.qkv'", f"num_ops {qkv:,}", f"int64 limit {INT64_MAX:,}")


def test_a_family_without_layers_is_stopped_by_the_builder(capsys, monkeypatch):
    def build(cfg):  # a model that never stops adding ops
        g = builder.GraphBuilder("endless", dims={"h": 8})
        x = g.input("x", ("b", "s", "h"), dtype="bf16")
        while True:
            (x,) = g.op("elementwise", "bsh->bsh", [x], name="relu")

    class Endless:
        @hookimpl
        def stage_models(self):
            return [ModelSpec("endless", "endless", build, {"endless": ToyConfig(name="endless")},
                              lambda d: ToyConfig(**d))]

    monkeypatch.setattr(builder, "MAX_MODEL_OPS", 300)
    host = fresh_host((Endless(), "endless"))
    status, _, err = run(host, capsys, "report", "--model", "endless")
    refused(status, err, "model endless: its graph passes 300 ops")


def test_report_keeps_its_json_keys_when_extrapolated(host, capsys):
    status, out, _ = run(host, capsys, "report", "--model", "toy", "--micro-batches", "100000", "--json")
    assert status == 0
    rc = json.loads(out)["rank_classes"][0]
    assert set(rc) == {"ranks", "flops", "memory_bytes", "comm_bytes", "wire_bytes", "kernel_bytes", "nodes"}
