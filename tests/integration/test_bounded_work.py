"""Bounded work through the command line (issue 9, point 4), with every plugin installed."""

import json

import pytest


def manifest_of(run_stage, command, *argv, out=None):
    extra = ["-o", out] if out else ["--json"]
    done = run_stage(command, *argv, *extra)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "manifest.json").read_text()) if out else json.loads(done.stdout)


@pytest.mark.parametrize("plan", [
    ["--model", "gpt2", "--pp", "2", "--micro-batches", "50", "--gpu", "h100"],
    ["--model", "mixtral-8x7b", "--set", "layers=2", "--seq-len", "256", "--tp", "2", "--sp", "--dp", "2",
     "--micro-batches", "9"],
    ["--model", "gpt-tiny", "--cp", "2", "--cp-comm", "p2p", "--pp", "2", "--micro-batches", "22"],
])
def test_an_extrapolated_report_is_the_generated_sets_manifest(run_stage, tmp_path, plan):
    report = manifest_of(run_stage, "report", *plan)
    written = manifest_of(run_stage, "generate", *plan, out=tmp_path / "set")
    for rc in written["rank_classes"]:
        assert len(rc.pop("program_sha256")) == 64  # what the files were validated as: a set's own key
    assert report["rank_classes"] == written["rank_classes"]  # FLOPs, memory, bytes, nodes, compute time


def test_report_of_100000_micro_batches_is_quick_and_small(run_stage):
    # 75 s and 5 GB before; timed by benchmarks/bench_report.py, here only its result
    done = run_stage("report", "--micro-batches", "100000", "--json")
    assert done.returncode == 0, done.stderr
    rc = json.loads(done.stdout)["rank_classes"][0]
    one = json.loads(run_stage("report", "--micro-batches", "1", "--json").stdout)["rank_classes"][0]
    two = json.loads(run_stage("report", "--micro-batches", "2", "--json").stdout)["rank_classes"][0]
    per_micro_batch = two["flops"]["total"] - one["flops"]["total"]
    assert rc["flops"]["total"] == one["flops"]["total"] + 99_999 * per_micro_batch


@pytest.mark.parametrize("layers", [1e30, 10**30, 10**9])
def test_a_config_json_with_a_huge_layer_count_is_one_line(run_stage, tmp_path, layers):
    # the issue: a config with num_hidden_layers 1e30 was OOM-killed
    from stage_core.plugins import PluginHost

    spec = next(s for s in PluginHost().models() if "llama-tiny" in s.presets)
    data = dict(spec.presets["llama-tiny"].to_hf(), num_hidden_layers=layers)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    done = run_stage("report", "--model", path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "num_hidden_layers" in done.stderr or f"layers={layers}" in done.stderr


def test_report_of_a_billion_micro_batches_is_analytic(run_stage):
    # generate refuses it (--max-nodes); report answers from one lowering of 4
    done = run_stage("report", "--micro-batches", "1000000000", "--json")
    assert done.returncode == 0, done.stderr
    rc = json.loads(done.stdout)["rank_classes"][0]
    one = json.loads(run_stage("report", "--micro-batches", "1", "--json").stdout)["rank_classes"][0]
    two = json.loads(run_stage("report", "--micro-batches", "2", "--json").stdout)["rank_classes"][0]
    assert rc["nodes"] == one["nodes"] + (10**9 - 1) * (two["nodes"] - one["nodes"])
