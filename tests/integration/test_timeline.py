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
    return result, json.loads(out.getvalue()), json.loads((root / "t.json").read_text()), root / "set"


def test_the_timeline_is_trace_event_json_with_a_track_per_class_and_stream(simulated):
    result, _, doc, _ = simulated
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


def test_each_event_carries_what_the_trace_says_of_its_node(host, simulated):
    """A slice's args hold its node's FLOPs and bytes (kernels), collective type, size, wire
    bytes and group (collectives), bytes and peer (sends): the trace's own attributes, read
    back with the core's reader; its name is its kind and micro-batch."""
    from stage_core.flow import read_trace_set

    result, _, doc, root = simulated
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    first = {pid: program.ranks[0] for pid, program in enumerate(result.job.programs, 1)}
    trace_set = read_trace_set(host, root)
    groups = {str(k): len(v) for k, v in trace_set.comm_groups.items()}
    nodes = {rank: {n.id: n for n in ns} for rank, ns in trace_set.iter_ranks() if rank in first.values()}
    kinds = set()
    for e in events:
        rank = first[e["pid"]]
        node = nodes[rank][e["args"]["node"]]
        args = e["args"]
        assert args["rank"] == rank and args["name"] == node.name
        if node.type == NodeType.COMP:
            assert (args["flops"], args["bytes"]) == (node.attr("num_ops"), node.attr("tensor_size"))
            assert args["duration_us"] == node.duration_micros or node.duration_micros == 0
        elif node.type == NodeType.COMM_COLL:
            kind = {0: "all_reduce", 2: "all_gather", 7: "reduce_scatter", 6: "all_to_all"}[node.attr("comm_type")]
            n = groups[node.attr("pg_name")]
            assert (args["comm_type"], args["bytes"], args["group"], args["group_ranks"]) == (
                kind, node.attr("comm_size"), node.attr("pg_name"), n)
            ring = {"all_reduce": 2 * (n - 1) / n, "all_gather": n - 1, "reduce_scatter": (n - 1) / n}[kind]
            assert args["wire_bytes"] == int(ring * node.attr("comm_size")) and e["cat"] == kind.replace("_", "-")
        else:
            peer = node.attr("comm_dst" if node.type == NodeType.COMM_SEND else "comm_src")
            assert (args["bytes"], args["peer"]) == (node.attr("comm_size"), peer)
        mb = args.get("micro_batch")
        assert e["name"] == e["cat"] + ("" if mb is None else f" {mb}")
        kinds.add(e["cat"])
    # a pipelined tp2 dp2 step: every kind of this plan is on the timeline
    assert kinds == {"forward", "backward", "optimizer", "all-reduce", "send", "receive"}


def test_each_class_step_is_compute_plus_exposed_communication_plus_bubble(simulated):
    result, results, _, _ = simulated
    by_rank = {r["rank"]: r for r in results["ranks"]}
    for row, rc in zip(results["rank_classes"], result.manifest["rank_classes"]):
        finish = by_rank[rc["ranks"][0]]["finish_time_ns"]
        assert row["compute_ns"] + row["exposed_comm_ns"] + row["bubble_ns"] == finish
        assert row["compute_ns"] == by_rank[rc["ranks"][0]]["gpu_time_ns"]  # the simulator's own count


def test_model_flops_are_megatrons(simulated):
    result, results, _, _ = simulated
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
              if e["ph"] == "X" and e["tid"] == 1]  # (the compute track)
    for mb in range(plan.micro_batches):
        mine = [e for e in events if e["args"].get("micro_batch") == mb]
        backward = min(e["ts"] for e in mine if e["cat"] == "backward")
        recompute = [e["ts"] for e in mine if e["cat"] == "recompute"]
        forward_end = max(e["ts"] + e["dur"] for e in mine if e["cat"] == "forward")
        assert recompute and min(recompute) >= forward_end and max(recompute) >= backward
        assert all(e["name"] == f"{e['cat']} {mb}" for e in mine)  # (named by kind and micro-batch)
