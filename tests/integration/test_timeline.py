"""`stage astrasim` on a pipelined, timed set: the per-class step report and the timeline."""

import io
import json
import os

import pytest

from stage_core import hardware
from stage_core.flow import plan_job, write_trace_set
from stage_core.parallel import Plan
from stage_core.trace import NodeType

ASTRA_SIM = os.environ.get("ASTRA_SIM_BIN")
pytestmark = pytest.mark.skipif(not ASTRA_SIM, reason="ASTRA_SIM_BIN is not set: no ASTRA-sim analytical binary")

PLAN = Plan(pp=2, tp=2, dp=2, micro_batches=4, seq_len=1024)


@pytest.fixture(scope="module")
def simulated(host, tmp_path_factory):
    from stage_adapter_astrasim.command import run_astrasim

    result = plan_job(host, "gpt2", {"layers": "4"}, PLAN, hardware.resolve(host, "a100"))
    root = tmp_path_factory.mktemp("timeline")
    write_trace_set(host, result, root / "set")
    out = io.StringIO()
    status = run_astrasim(root / "set", astra_sim=ASTRA_SIM, timeline_file=str(root / "t.json"), out=out,
                          err=io.StringIO(), as_json=True)
    assert status == 0
    return result, json.loads(out.getvalue()), json.loads((root / "t.json").read_text())


def test_the_timeline_is_trace_event_json_with_a_track_per_class_and_stream(simulated):
    result, _, doc = simulated
    # the trace-event format: {"traceEvents": [...]}, complete events "X" with name, cat,
    # pid, tid, ts and dur (microseconds); metadata events "M" naming processes and threads
    assert set(doc) >= {"traceEvents"}
    tracks, processes = {}, {}
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M" and e["name"] == "thread_name":
            tracks[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["ph"] == "M" and e["name"] == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e["ph"] == "X":
            assert isinstance(e["name"], str) and e["ts"] >= 0 and e["dur"] >= 0
    assert len(processes) == len(result.job.programs) == PLAN.pp
    assert sorted(set(tracks.values())) == ["communication", "compute", "receives"]
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert all((e["pid"], e["tid"]) in tracks for e in events)
    # every node of each shown rank is on its track once
    for pid, program in enumerate(result.job.programs, 1):
        mine = [e for e in events if e["pid"] == pid]
        assert len(mine) == len(program.nodes)
        # the compute track replays the durations: ASTRA-sim runs duration x 1000 ns (1 ns for a 0)
        compute = sum(e["dur"] for e in mine if tracks[(pid, e["tid"])] == "compute")
        timed = [n.duration_micros for n in program.nodes if n.type == NodeType.COMP]
        assert compute == pytest.approx(sum(timed) + 1e-3 * timed.count(0))


def test_each_class_step_is_compute_plus_exposed_communication_plus_bubble(simulated):
    result, results, _ = simulated
    by_rank = {r["rank"]: r for r in results["ranks"]}
    for row, rc in zip(results["rank_classes"], result.manifest["rank_classes"]):
        finish = by_rank[rc["ranks"][0]]["finish_time_ns"]
        assert row["compute_ns"] + row["exposed_comm_ns"] + row["bubble_ns"] == finish
        assert row["compute_ns"] == by_rank[rc["ranks"][0]]["gpu_time_ns"]  # the simulator's own count


def test_model_flops_are_megatrons(simulated):
    result, results, _ = simulated
    summary = results["summary"]
    c, p = result.manifest["model"], result.manifest["plan"]
    B, s, L, h, V = p["global_batch"], p["seq_len"], c["layers"], c["hidden"], 50304  # GPT-2 vocab padded to 128
    megatron = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))  # Narayanan et al. 2021, eq. (3)
    step = summary["max_finish_time_ns"] * 1e-9
    assert summary["model_tflops_per_gpu"] * 1e12 * step * PLAN.world_size == pytest.approx(megatron, rel=1e-9)
    assert summary["mfu"] == pytest.approx(summary["model_tflops_per_gpu"] / 312.0)


def test_recompute_runs_in_backward_not_while_the_forward_waits(host, tmp_path):
    """Full recompute redoes a layer's forward when the backward reaches the layer: no
    recomputed kernel may fill the compute slot while the forward waits on a TP collective."""
    from stage_adapter_astrasim.command import run_astrasim

    plan = Plan(tp=2, dp=2, micro_batches=2, recompute="full", seq_len=1024)
    result = plan_job(host, "gpt2", {"layers": "4"}, plan, hardware.resolve(host, "a100"))
    write_trace_set(host, result, tmp_path / "set")
    assert run_astrasim(tmp_path / "set", astra_sim=ASTRA_SIM, timeline_file=str(tmp_path / "t.json"),
                        out=io.StringIO(), err=io.StringIO()) == 0
    events = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
              if e["ph"] == "X" and e["cat"] == "compute"]
    for mb in range(plan.micro_batches):
        backward = min(e["ts"] for e in events if e["name"].startswith(f"mb{mb}.bwd."))
        recompute = [e["ts"] for e in events if e["name"].startswith(f"mb{mb}.recompute.")]
        forward_end = max(e["ts"] + e["dur"] for e in events if e["name"].startswith(f"mb{mb}.fwd."))
        assert recompute and min(recompute) >= forward_end and max(recompute) >= backward
