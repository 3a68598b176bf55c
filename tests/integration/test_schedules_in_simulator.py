"""The schedule plugins in the real simulator: ZB-H1, ZB-H2, ZB-V and DualPipeV against 1F1B on
one plan timed on an H100 (every rank finishes, the same matmul FLOPs, a shorter step), DualPipeV
and DualPipe on a DeepSeek-V3-shaped MoE with experts over data parallel, Llama 3's flexible interleaved
schedule with micro-batches that are not a multiple of pp, and a third party's schedule
installed from its own folder."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import child_python
from stage_core.flow import plan_job, write_trace_set
from stage_core.hardware import resolve
from stage_core.parallel.plan import Plan

LLAMA = ("llama3-8b", {"layers": "8", "vocab_size": "32000"})


@pytest.fixture(scope="module")
def runs(host, tmp_path_factory):
    """Each schedule's set (Llama 3 8B's shape, 8 layers, pp 4, 8 micro-batches of 2,048 tokens) and
    its simulation."""
    hw = resolve(host, "h100")
    out = {}
    root = tmp_path_factory.mktemp("schedules")
    for schedule in ("1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipev"):
        result = plan_job(host, LLAMA[0], LLAMA[1], Plan(pp=4, micro_batches=8, seq_len=2048, schedule=schedule), hw)
        out[schedule] = (result, write_trace_set(host, result, root / schedule))
    return out


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2", "zb-v", "dualpipev"])
def test_a_schedule_finishes_with_1f1bs_matmuls_and_a_shorter_step(runs, schedule, replay_and_simulate):
    result, target = runs[schedule]
    base, base_target = runs["1f1b"]
    verdict, status, got = replay_and_simulate(target)
    assert verdict.finishes and status == 0 and got["summary"]["finished_ranks"] == 4
    _, _, ref = replay_and_simulate(base_target)
    assert got["summary"]["max_finish_time_ns"] < ref["summary"]["max_finish_time_ns"]
    matmuls = [sum(rc["flops"]["matmul"] for rc in r.manifest["rank_classes"]) for r in (result, base)]
    assert matmuls[0] == matmuls[1]


def test_zb_h1_keeps_1f1bs_memory_on_the_first_stage_and_its_pipeline_bytes(runs):
    h1, f1 = runs["zb-h1"][0].manifest["rank_classes"], runs["1f1b"][0].manifest["rank_classes"]
    assert [rc["comm_bytes"]["send"] for rc in h1] == [rc["comm_bytes"]["send"] for rc in f1]
    first = h1[0]["memory_bytes"]["activations"] / f1[0]["memory_bytes"]["activations"]
    assert 1 <= first < 1.01  # p micro-batches in flight, W right after B: what 1F1B keeps (and W's bit)


def test_zb_v_sends_twice_the_pipeline_bytes(runs):
    # two chunk boundaries a stage; the turn on the last stage stays on it
    v, f1 = runs["zb-v"][0].manifest["rank_classes"], runs["1f1b"][0].manifest["rank_classes"]
    assert sum(rc["comm_bytes"]["send"] for rc in v) == 2 * sum(rc["comm_bytes"]["send"] for rc in f1)


@pytest.mark.parametrize("micro_batches,options", [(6, {}), (10, {"round_size": 5}), (3, {})])
def test_llama3s_schedule_runs_any_micro_batch_count(host, tmp_path, micro_batches, options, replay_and_simulate):
    # pp 4 with 2 chunks a stage: 6 and 10 micro-batches are no multiple of 4 (interleaved 1F1B refuses them),
    # 10 in the paper's Figure 6 rounds of N = 5, 3 fewer than the stages; every rank finishes, the job's
    # matmuls are 1F1B's, and the interleaving shortens the step (bubble (pp-1)/(V·M) against (pp-1)/M)
    hw = resolve(host, "h100")
    plan = Plan(pp=4, micro_batches=micro_batches, seq_len=2048, schedule="llama3", virtual_stages=2)
    result = plan_job(host, LLAMA[0], LLAMA[1], plan.with_options(**options), hw)
    base = plan_job(host, LLAMA[0], LLAMA[1], plan.replace(schedule="1f1b", virtual_stages=1), hw)
    steps = []
    for r, name in ((result, "llama3"), (base, "1f1b")):
        verdict, status, got = replay_and_simulate(write_trace_set(host, r, tmp_path / name))
        assert verdict.finishes and status == 0 and got["summary"]["finished_ranks"] == 4
        steps.append(got["summary"]["max_finish_time_ns"])
    assert [sum(rc["flops"]["matmul"] for rc in r.manifest["rank_classes"]) for r in (result, base)] == [
        sum(rc["flops"]["matmul"] for rc in base.manifest["rank_classes"])] * 2
    assert steps[0] < steps[1]


def exposed_all_to_all_us(timeline: Path) -> dict[int, float]:
    """Per shown rank (a trace-event process), the microseconds an all-to-all is in flight while no kernel runs,
    from the simulator's own node log (`stage astrasim --timeline`)."""
    events = json.loads(timeline.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    out = {}
    for pid in {e["pid"] for e in events if e.get("ph") == "X"}:
        mine = [e for e in events if e.get("ph") == "X" and e["pid"] == pid]
        busy = sorted((e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == 1)  # (the compute track)
        total = 0.0
        for e in mine:
            if e["cat"] != "all-to-all":
                continue
            a, b = e["ts"], e["ts"] + e["dur"]
            covered = sum(max(0.0, min(b, y) - max(a, x)) for x, y in busy)  # kernels do not overlap each other
            total += (b - a) - covered
        out[pid] = total
    return out


def test_dualpipev_and_dualpipe_hide_expert_all_to_alls_on_a_deepseek_shaped_moe(host, tmp_path, replay_and_simulate):
    from conftest import ASTRA_SIM
    from stage_adapter_astrasim.command import run_astrasim

    hw = resolve(host, "h100")
    steps, exposed, pipeline, results = {}, {}, {}, {}
    for schedule in ("1f1b", "dualpipev", "dualpipe"):
        plan = Plan(pp=4, dp=2, ep=2, micro_batches=8, seq_len=1024, schedule=schedule)
        result = results[schedule] = plan_job(host, "deepseek-v3", {"layers": "8", "first_dense_layers": "1"}, plan,
                                              hw)
        target = write_trace_set(host, result, tmp_path / schedule)
        verdict, status, got = replay_and_simulate(target)
        assert verdict.finishes and status == 0 and got["summary"]["finished_ranks"] == 8
        steps[schedule] = got["summary"]["max_finish_time_ns"]
        timeline = tmp_path / f"{schedule}.json"
        assert run_astrasim(target, astra_sim=ASTRA_SIM, system="h100", timeline_file=str(timeline), out=open(
            tmp_path / "out.txt", "w"), err=open(tmp_path / "err.txt", "w")) == 0
        exposed[schedule] = sum(exposed_all_to_all_us(timeline).values())
        pipeline[schedule] = last_micro_batch_end_us(timeline)
    assert steps["dualpipev"] < steps["1f1b"]
    assert exposed["dualpipev"] < exposed["1f1b"]  # the overlapped pairs hide the expert all-to-alls
    # DualPipe: both directions' pairs hide them too, and its micro-batches are done sooner than 1F1B's; its step is
    # longer here (8 micro-batches): two copies' gradients summed over the pair and two copies' optimizer updates
    assert exposed["dualpipe"] < exposed["1f1b"] and pipeline["dualpipe"] < pipeline["1f1b"]
    p1, p2 = ([rc["memory_bytes"]["parameters"] for rc in results[s].manifest["rank_classes"]] for s in ("1f1b",
                                                                                                     "dualpipe"))
    assert p2 == [p1[0] + p1[3], p1[1] + p1[2], p1[1] + p1[2], p1[0] + p1[3]]  # two copies: chunks s and 3-s


def last_micro_batch_end_us(timeline: Path) -> float:
    """When the last node of a micro-batch's steps ends, over the ranks shown (before the gradient sync and the
    optimizer)."""
    events = json.loads(timeline.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    return max(e["ts"] + e["dur"] for e in events if e.get("ph") == "X" and e["args"].get("name", "").startswith("mb"))


def test_a_third_partys_schedule_installed_from_its_folder_works(tmp_path):
    folder = Path(__file__).parent / "data" / "thirdparty-schedule"
    python = child_python(tmp_path)
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", folder],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-2000:]
    cli = [python, "-m", "stage_core.cli"]
    made = subprocess.run([*cli, "generate", "--model", "gpt-tiny", "--pp", "2", "--micro-batches", "4",
                           "--schedule", "lagged-1f1b", "-o", tmp_path / "set", "-q"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    checked = subprocess.run([*cli, "validate", tmp_path / "set", "--json"], capture_output=True, text=True)
    assert json.loads(checked.stdout)["replay"]["finishes"]
    # its W steps are the weight gradients: they ran after B, in a split backward
    names = subprocess.run([*cli, "report", "--model", "gpt-tiny", "--pp", "2", "--micro-batches", "4",
                            "--schedule", "lagged-1f1b", "--json"], capture_output=True, text=True)
    assert names.returncode == 0 and json.loads(names.stdout)["plan"]["schedule"] == "lagged-1f1b"


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_and_tied_embeddings_keep_working_with_the_split(host, tmp_path, schedule, recompute):
    # gpt-tiny ties its embedding to its head (one tensor read on the first and the last
    # stage); with recompute (stage-parallel's) each B and W finds the forward it needs: 1F1B's
    # matmul FLOPs and pipeline bytes per rank with the same recompute, and every rank finishes
    # in the replay and in the real simulator where one is installed
    from stage_core.testing import assert_schedule_like_1f1b

    plans = [Plan(pp=2, micro_batches=4, recompute=recompute), Plan(pp=4, micro_batches=8, recompute=recompute)]
    rows = assert_schedule_like_1f1b(host, schedule, tmp_path, model="gpt-tiny", plans=plans,
                                     overrides={"layers": "8"})
    assert [r["replay"] for r in rows] == ["finishes", "finishes"]
