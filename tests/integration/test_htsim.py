"""The same sets under ASTRA-sim's packet-level htsim backend: verdicts and compute agree.

A representative part of the strategy matrix (dp, tp+sp, the pp schedules, cp, ep,
ZeRO-3, prefill and decode), timed on h100 and within one node (8 ranks at most: across
nodes htsim's frontend aborts, see the adapter's README), runs under the analytical
backend and under htsim.  Each set must finish on every rank in both, as `stage
validate`'s replay says; the compute each rank does (ASTRA-sim's ``GPU time``) is the
same number in both, since only the network differs.  The step under htsim against the
analytical one is listed at the end of the run (``benchmarks/bench_backends.py`` says
what the difference means).  A set broken on purpose leaves the ranks the replay names
unfinished under htsim too, which reports it at its 4 s limit.
"""

import io
import json
import os

import pytest

from stage_core.parallel import Plan

HTSIM = os.environ.get("ASTRA_SIM_HTSIM_BIN")
ANALYTICAL = os.environ.get("ASTRA_SIM_BIN")

pytestmark = pytest.mark.skipif(
    not (HTSIM and ANALYTICAL),
    reason="ASTRA_SIM_HTSIM_BIN and ASTRA_SIM_BIN are not both set: no htsim and analytical ASTRA-sim binaries "
           "(CI sets them from ../shared/astra-sim)")

TINY_LLAMA = {"layers": 2}
MATRIX = [
    ("dp", "gpt-tiny", Plan(dp=4), {}),
    ("tp+sp", "llama-tiny", Plan(tp=2, sp=True, dp=2), TINY_LLAMA),
    ("pp 1f1b", "gpt-tiny", Plan(pp=2, micro_batches=4, schedule="1f1b"), {}),
    ("pp gpipe", "gpt-tiny", Plan(pp=2, dp=2, micro_batches=4, schedule="gpipe"), {}),
    ("pp interleaved", "gpt-tiny", Plan(pp=2, tp=2, micro_batches=4, schedule="interleaved", virtual_stages=2),
     {"layers": 4}),
    ("cp", "llama-tiny", Plan(cp=2, tp=2, sp=True, cp_comm="p2p", micro_batches=2), TINY_LLAMA),
    ("ep", "moe-tiny", Plan(dp=4, ep=4, seq_len=64), {}),
    ("zero-3", "gpt-tiny", Plan(dp=4, zero=3), {}),
    ("prefill", "llama-tiny", Plan(task="prefill", tp=2, pp=2, micro_batches=2, seq_len=256), TINY_LLAMA),
    ("decode", "llama-tiny", Plan(task="decode", tp=2, dp=2, micro_batch_size=4, context_len=128), TINY_LLAMA),
]


def _run(out, backend, binary, validate=True, **options):
    """`stage astrasim` on ``out``: (exit status, results, stderr).  The hand-made sets below
    carry no rank classes in their manifest, so they run with ``validate=False``."""
    from stage_adapter_astrasim.command import run_astrasim

    text, err = io.StringIO(), io.StringIO()
    status = run_astrasim(out, astra_sim=binary, backend=backend, as_json=True, out=text, err=err, validate=validate,
                          **options)
    return status, json.loads(text.getvalue()), err.getvalue()


@pytest.mark.parametrize("label,model,plan,overrides", MATRIX, ids=[m[0] for m in MATRIX])
def test_the_matrix_subset_finishes_under_htsim_as_under_the_analytical_network(
        host, tmp_path, request, label, model, plan, overrides):
    from stage_core import hardware
    from stage_core.flow import plan_job, read_trace_set, write_trace_set
    from stage_core.validate import examine

    result = plan_job(host, model, {k: str(v) for k, v in overrides.items()}, plan, hardware.resolve(host, "h100"))
    out = write_trace_set(host, result, tmp_path / "set")
    verdict = examine(read_trace_set(host, out)).verdict
    assert verdict.finishes
    status, analytical, _ = _run(out, "analytical", ANALYTICAL)
    assert status == 0
    status, packets, err = _run(out, "htsim", HTSIM)
    summary = packets["summary"]
    assert (status, summary["outcome"], summary["unfinished_ranks"]) == (0, "finished", []), err
    assert summary["finished_ranks"] == plan.world_size
    assert packets["backend"] == "htsim" and packets["topology"] == "preset h100"
    gpu = {r["rank"]: r["gpu_time_ns"] for r in analytical["ranks"]}
    assert {r["rank"]: r["gpu_time_ns"] for r in packets["ranks"]} == gpu
    step_a, step_h = analytical["summary"]["max_finish_time_ns"], summary["max_finish_time_ns"]
    assert step_h >= max(gpu.values())  # a rank's kernels run one at a time
    # htsim's per-node log breaks each class's step down as the analytical one's does
    for row in packets["rank_classes"]:
        shown = {r["rank"]: r for r in packets["ranks"]}[row["shown_rank"]]
        assert row["compute_ns"] + row["exposed_comm_ns"] + row["bubble_ns"] == shown["finish_time_ns"]
        assert row["compute_ns"] == shown["gpu_time_ns"]  # one kernel at a time: its busy time is its GPU time
    request.config.__dict__.setdefault("htsim_rows", []).append(
        f"htsim {label:<15} {model} {plan.world_size} ranks: {summary['finished_ranks']}/{plan.world_size} finished, "
        f"step {step_h / 1e6:.3f} ms, analytical {step_a / 1e6:.3f} ms ({step_h / step_a:.2f}x)")


def test_a_set_broken_on_purpose_stops_the_ranks_the_replay_names(host, tmp_path):
    """Rank 1 of a dp2 set loses its last gradient all-reduce: the replay names the ranks
    that never finish; the analytical backend reports them as a deadlock, htsim leaves
    the same ranks unfinished when it stops at 4 s of simulated time, and says it cannot
    tell that from a long step (the set was not validated)."""
    from stage_core.flow import read_trace_set
    from stage_core.trace import NodeType
    from stage_core.validate import examine
    from test_differential import dropped, written

    out = written(host, tmp_path, "gpt-tiny", Plan(dp=2), {}, dropped(NodeType.COMM_COLL, -1), 1)
    stuck = list(examine(read_trace_set(host, out)).verdict.unfinished)
    assert stuck == [0]
    status, analytical, _ = _run(out, "analytical", ANALYTICAL, validate=False)
    assert (status, analytical["summary"]["outcome"], analytical["summary"]["deadlocked_ranks"]) == (1, "deadlock", stuck)
    status, packets, err = _run(out, "htsim", HTSIM, validate=False)
    summary = packets["summary"]
    assert (status, summary["outcome"], summary["unfinished_ranks"], summary["deadlocked_ranks"]) == (
        1, "time_limit", stuck, [])
    assert "error: htsim stopped at its limit of 4 s of simulated time with ranks 0 unfinished (1 of 2)" in err
    assert "either the step takes longer, or these ranks wait forever" in err


# --------------------------------------------------------------------------- htsim's limits, each one line


def _one_node_set(host, out, programs, world=2):
    """A set of hand-made programs (``programs[r]`` for rank r) on one group of every rank."""
    from stage_core.flow import comm_groups_json
    from stage_core.trace import RankProgram, TraceJob

    job = TraceJob(programs=[RankProgram((r,), tuple(p)) for r, p in enumerate(programs)], world_size=world,
                   comm_groups={"1": list(range(world))}, group_name=lambda r, key: "1",
                   peer_rank=lambda r, key: 1 - r)
    out.mkdir()
    host.backend("chakra").write(job, out)
    (out / "comm_groups.json").write_text(comm_groups_json(job.comm_groups))
    (out / "manifest.json").write_text(json.dumps({"world_size": world, "format": "chakra-et-0.0.4"}))
    return out


def _kernel(i, flops, deps=()):
    from stage_core.trace import NodeType, ProgramNode

    return ProgramNode(i, f"k{i}", NodeType.COMP, tuple(deps), num_ops=flops, tensor_size=10**6)


def _allreduce(i, size, deps=()):
    from stage_core.trace import CollectiveType, NodeType, ProgramNode

    return ProgramNode(i, "ar", NodeType.COMM_COLL, tuple(deps), comm_type=CollectiveType.ALL_REDUCE,
                       comm_size=size, group="g")


def test_messages_over_htsims_int_are_refused_before_the_run(host, tmp_path):
    """htsim's frontend holds a message's size in a C int, and TCP adds a 1,500-byte packet:
    2,147,482,147 bytes at most.  A 3 GiB send is refused, and so is a 20 GiB all-reduce on
    2 ranks (4 chunks, each sent in halves: 2.5 GiB messages); a 16 GiB all-reduce on 8
    ranks sends 512 MiB messages and runs."""
    from stage_core.errors import UsageError
    from stage_core.trace import NodeType, ProgramNode

    send = [[ProgramNode(0, "send", NodeType.COMM_SEND, comm_size=3 << 30, peer="p", tag=1)],
            [ProgramNode(0, "recv", NodeType.COMM_RECV, comm_size=3 << 30, peer="p", tag=1)]]
    out = _one_node_set(host, tmp_path / "send", send)
    with pytest.raises(UsageError) as refused:
        _run(out, "htsim", HTSIM, validate=False)
    assert str(refused.value) == (
        "htsim cannot run rank 0's node 0 (send): a send handing the network a message of 3,221,225,472 bytes; its "
        "frontend holds a message's size in a C int, 2,147,482,147 bytes at most (2^31 - 1 less TCP's extra "
        "packet); use --backend analytical, or smaller micro-batches")
    assert not (out / "astrasim").exists()
    out = _one_node_set(host, tmp_path / "ar", [[_allreduce(0, 20 << 30)]] * 2)
    with pytest.raises(UsageError, match="a collective handing the network a message of 2,684,354,560 bytes"):
        _run(out, "htsim", HTSIM, validate=False)
    from stage_adapter_astrasim import simulate

    prep = simulate.prepare(_one_node_set(host, tmp_path / "ar8", [[_allreduce(0, 16 << 30)]] * 8, world=8),
                            backend="htsim", astra_sim=HTSIM, host=host, validate=False)
    assert prep.paths.topology.is_file()  # read and checked, written, ready to run


def test_a_step_past_htsims_3_s_is_refused_before_the_run_or_fails_as_htsim_does(host, tmp_path):
    """htsim ends every run at 4 s of simulated time, and a message that starts after about
    3 s aborts it.  Kernels run one at a time, so a rank whose kernels add up past 3 s is
    refused before the run.  Under it: a kernel of 2.9 s then a 64 MiB all-reduce finishes
    (785 us of ring in htsim); a kernel of 2.9995 s then the same all-reduce (its later
    messages start after 3 s) aborts htsim, reported as a failure with what it means, not
    as a deadlock.  (On h100-calibrated, the h100 with datasheet links, whose all-reduce takes
    these times; the h100 preset's links are fitted to measured NCCL times.)"""
    from stage_core.errors import UsageError

    peak = 989.4e12  # the h100 preset's roofline: a kernel's time is its FLOPs over this
    out = _one_node_set(host, tmp_path / "long", [[_kernel(0, int(5 * peak)), _allreduce(1, 1 << 16, (0,))]] * 2)
    with pytest.raises(UsageError) as refused:
        _run(out, "htsim", HTSIM, validate=False, system="h100-calibrated")
    assert str(refused.value) == (
        "htsim cannot run a step past 3 s of simulated time (a message that starts later aborts it, and every run "
        "ends at 4 s), and rank 0's kernels alone take 5.000 s (one at a time); use --backend analytical")
    out = _one_node_set(host, tmp_path / "under", [[_kernel(0, int(2.9 * peak)), _allreduce(1, 64 << 20, (0,))]] * 2)
    status, packets, err = _run(out, "htsim", HTSIM, validate=False, system="h100-calibrated")
    assert (status, packets["summary"]["outcome"]) == (0, "finished"), err
    out = _one_node_set(host, tmp_path / "edge", [[_kernel(0, int(2.9995 * peak)), _allreduce(1, 64 << 20, (0,))]] * 2)
    status, packets, err = _run(out, "htsim", HTSIM, validate=False, system="h100-calibrated")
    assert (status, packets["summary"]["outcome"], packets["summary"]["deadlocked_ranks"]) == (1, "failed", [])
    assert ("error: ASTRA-sim (htsim) was killed by SIGABRT with ranks 0-1 unfinished (2 of 2): AstraSim_HTSim: "
            "eventlist.cpp:69: static void EventList::sourceIsPending(EventSource&, simtime_picosec): Assertion "
            "`when>=now()' failed. (htsim's TCP retransmission timer scheduled an event in the past; seen after packet "
            "loss between nodes, and for every message that starts after 3 s of simulated time") in err


def test_a_topology_that_does_not_fit_the_world_is_refused_before_the_run(host, tmp_path):
    from stage_core.errors import UsageError

    out = _one_node_set(host, tmp_path / "set", [[_allreduce(0, 1 << 20)]] * 2)
    topo = os.path.join(os.path.dirname(HTSIM), "htsim-examples", "switch4_3200g_936ns.topo")
    with pytest.raises(UsageError) as refused:
        _run(out, "htsim", HTSIM, validate=False, topology=topo)
    assert str(refused.value) == (f"--topology {topo}: Nodes 4 but the trace set has world size 2: htsim needs one "
                                  "host per rank")
    assert not (out / "astrasim").exists()
    status, packets, _ = _run(out, "htsim", HTSIM, validate=False, topology=topo.replace("switch4", "switch2"))
    assert status == 0 and packets["topology"].startswith("file ")


def test_across_nodes_the_preset_fat_tree_runs_and_an_abort_is_a_failure(host, tmp_path):
    """16 ranks of h100: a ToR switch per node, an uplink per GPU to 8 aggregation switches
    (the .topo by hand: 3,438 Gb/s hosts, 382 Gb/s uplinks, 18 uplinks per aggregation
    switch in the loader's count).  A 64 KiB send from rank 0 to rank 8 (across nodes)
    finishes, slower than one inside a node.  (h100-calibrated: the datasheet links these
    figures are of.)"""
    from stage_core.trace import NodeType, ProgramNode

    def one_send(name, world, peer):
        programs = [[_kernel(0, 10**9)] for _ in range(world)]
        programs[0] = [ProgramNode(0, "send", NodeType.COMM_SEND, comm_size=1 << 16, peer="p", tag=1)]
        programs[peer] = [ProgramNode(0, "recv", NodeType.COMM_RECV, comm_size=1 << 16, peer="p", tag=1)]
        from stage_core.flow import comm_groups_json
        from stage_core.trace import RankProgram, TraceJob

        job = TraceJob(programs=[RankProgram((r,), tuple(p)) for r, p in enumerate(programs)], world_size=world,
                       comm_groups={"1": list(range(world))}, group_name=lambda r, key: "1",
                       peer_rank=lambda r, key: peer if r == 0 else 0)
        out = tmp_path / name
        out.mkdir()
        host.backend("chakra").write(job, out)
        (out / "comm_groups.json").write_text(comm_groups_json(job.comm_groups))
        (out / "manifest.json").write_text(json.dumps({"world_size": world, "format": "chakra-et-0.0.4"}))
        status, results, err = _run(out, "htsim", HTSIM, validate=False, system="h100-calibrated")
        assert status == 0, err
        return out, {r["rank"]: r["finish_time_ns"] for r in results["ranks"]}[peer]

    out, across = one_send("across", 16, 8)
    topo = (out / "astrasim" / "topology.topo").read_text()
    assert "Nodes 16\nTiers 2\nPodsize 16\n\nTier 0\nDownlink_speed_Gbps 3438\nRadix_Down 8\nRadix_Up 8\n" in topo
    assert "Tier 1\nDownlink_speed_Gbps 382\nRadix_Down 18\nDownlink_Latency_ns 2644\n" in topo
    _, inside = one_send("inside", 8, 1)
    assert across > inside
