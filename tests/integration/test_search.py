"""stage search on real models: the fast estimate's memory is the lowering's, its step time
close to the replay's, and the command ranks, simulates and reports."""

import json

import pytest

from stage_core import hardware
from stage_core.flow import plan_job
from stage_core.cli import main
from stage_core.parallel.plan import Plan
from stage_search import probe
from stage_search.estimate import estimate_job
from stage_search.fast import estimate_plans
from stage_search.space import stage_layers

MODEL, LAYERS = "llama3-8b", 12
SET = {"layers": str(LAYERS)}
PLANS = [
    Plan(tp=2, pp=2, dp=4, sp=True, micro_batches=8, seq_len=2048),
    Plan(tp=2, pp=4, dp=2, sp=True, micro_batches=8, seq_len=2048, zero=1, recompute="selective"),
    Plan(tp=4, pp=2, dp=2, sp=True, micro_batches=4, seq_len=2048, zero=2, micro_batch_size=2),
    Plan(tp=2, dp=8, sp=True, micro_batches=2, seq_len=2048, zero=3),
    Plan(tp=2, pp=2, dp=4, sp=True, micro_batches=8, seq_len=2048, schedule="interleaved", virtual_stages=2,
         recompute="full"),
    Plan(tp=2, cp=2, pp=2, dp=2, sp=True, micro_batches=4, seq_len=4096),
    Plan(tp=1, pp=5, dp=2, micro_batches=10, seq_len=1024, stage_layers=stage_layers(LAYERS, 5)),
    Plan(tp=2, pp=2, dp=4, sp=True, micro_batches=8, seq_len=2048, schedule="gpipe"),
]


@pytest.fixture(scope="module")
def fast_and_replay(host):
    hw = hardware.resolve(host, "h100")
    costs = {}
    for p in PLANS:
        costs.setdefault(probe.layer_key(p), probe.measure(host, MODEL, SET, p, hw))
    orders = {s.name: s.order for s in host.schedules()}
    fast = estimate_plans(PLANS, costs, LAYERS, hw, orders.__getitem__)
    replays = []
    for p in PLANS:
        result = plan_job(host, MODEL, SET, p, hw)
        memory = max(rc["memory_bytes"]["total"] for rc in result.manifest["rank_classes"])
        replays.append((estimate_job(result.job, hw).step_ns, memory))
    return fast, replays


@pytest.mark.parametrize("i", range(len(PLANS)))
def test_the_fast_memory_is_the_lowerings(fast_and_replay, i):
    fast, replays = fast_and_replay
    assert fast.memory[i] == pytest.approx(replays[i][1], rel=1e-6)


@pytest.mark.parametrize("i", range(len(PLANS)))
def test_the_fast_step_is_close_to_the_replays(fast_and_replay, i):
    fast, replays = fast_and_replay
    assert fast.step_ns[i] == pytest.approx(replays[i][0], rel=0.06)


def test_search_ranks_simulates_and_reports(host, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (stage-search[plot])")
    args = ["search", "--model", MODEL, "--set", "layers=4", "--gpus", "8", "--gpu", "h100", "--seq-len", "1024",
            "--global-batch", "8", "--max-pp", "2", "--micro-batch-size", "1", "--recompute", "none",
            "--top", "2", "--candidates", "3", "--json", "--plot", str(tmp_path / "front.png")]
    assert main(args, host=host) == 0
    out, err = capsys.readouterr()
    table = json.loads(out)
    plans = table["plans"]
    assert table["enumerated"] == table["valid"] + sum(table["refused"].values())
    assert len(plans) == table["valid"] - table["do_not_fit"]
    replayed = [p for p in plans if p["estimator"] == "replay"]
    assert len(replayed) == 3 and plans[:3] == replayed
    assert [p["step_time_s"] for p in replayed] == sorted(p["step_time_s"] for p in replayed)
    assert all(p["memory_bytes"] <= table["gpu_memory_bytes"] for p in plans)
    # the best plan, written and run again, is the plan the table names
    best = plans[0]
    from stage_core.planning import plan_from_flags

    plan = plan_from_flags(["--model", MODEL, "--set", "layers=4", *best["plan"]]).plan
    assert plan.world_size == 8 and plan.global_batch == 8
    if table["simulator"]["ran"]:  # the simulator ran the best two: the replay is its step
        for p in plans[:2]:
            assert p["simulated_step_time_s"] == pytest.approx(p["step_time_s"], rel=0.005)
    else:
        assert "showing estimates only" in err
    assert (tmp_path / "front.png").stat().st_size > 1000


def test_without_a_simulator_search_says_so_and_shows_estimates(host, capsys, monkeypatch):
    monkeypatch.setenv("ASTRA_SIM_BIN", "/nonexistent/astra-sim")
    args = ["search", "--model", MODEL, "--set", "layers=4", "--gpus", "8", "--seq-len", "1024",
            "--global-batch", "8", "--tp", "2", "--pp", "2", "--micro-batch-size", "1", "--recompute", "none",
            "--zero", "0", "--top", "1", "--candidates", "1"]
    assert main(args, host=host) == 0
    out, err = capsys.readouterr()
    assert "not simulated: astrasim cannot run here" in err and "showing estimates only" in err
    assert "tp2 pp2 dp2" in out


def test_a_search_with_no_plan_that_fits_says_why(host, capsys):
    args = ["search", "--model", MODEL, "--gpus", "8", "--gpu-memory", "1", "--seq-len", "1024", "--tp", "8",
            "--recompute", "none", "--zero", "0", "--no-simulate"]
    assert main(args, host=host) == 2
    assert "no plan fits in 1 GiB per GPU" in capsys.readouterr().err


def test_a_decode_search_ranks_serving_plans_by_the_replay(host, capsys):
    args = ["search", "--model", MODEL, "--set", "layers=4", "--gpus", "8", "--gpu", "h100", "--task", "decode",
            "--seq-len", "2048", "--global-batch", "16", "--no-simulate", "--json"]
    assert main(args, host=host) == 0
    table = json.loads(capsys.readouterr().out)
    plans = table["plans"]
    assert table["task"] == "decode" and len(plans) == table["valid"] - table["do_not_fit"] > 3
    steps = [p["step_time_s"] for p in plans]
    assert steps == sorted(steps)
    # each row is what stage estimate says of its flags, and serves 16 tokens per step
    best = plans[0]
    assert main(["estimate", "--model", MODEL, "--set", "layers=4", "--gpu", "h100", *best["plan"], "--json"],
                host=host) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == best["step_time_s"]
    assert best["tokens_per_s"] == pytest.approx(16 / best["step_time_s"])
