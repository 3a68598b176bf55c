"""The estimate's replay on a hand-built job, every time worked out by hand."""

import json
import math

import pytest

from stage_core.api import CollectiveType, NodeType, Plan, ProgramNode, RankProgram, TraceJob, main, plan_job
from stage_core import hookimpl
from stage_core.records import SimulatorSpec
from stage_core.testing import fresh_host, toy_plugin
from stage_search.estimate import estimate_job
from search_hardware import H100, Hardware

MiB = 1 << 20
GROUPS = {"1": [0, 1], "2": [2, 3]}


def comp(i, micros, deps=(), ctrl=()):
    return ProgramNode(i, f"c{i}", NodeType.COMP, tuple(deps), tuple(ctrl), num_ops=1, tensor_size=1,
                       duration_micros=micros)


def p2p(i, kind, peer, deps=(), ctrl=()):
    return ProgramNode(i, f"p{i}", kind, tuple(deps), tuple(ctrl), comm_size=MiB, peer=peer, tag=1)


def allreduce(i, deps=(), ctrl=()):
    return ProgramNode(i, f"ar{i}", NodeType.COMM_COLL, tuple(deps), tuple(ctrl),
                       comm_type=CollectiveType.ALL_REDUCE, comm_size=MiB, group="dp")


def two_stages() -> TraceJob:
    """pp2 x dp2 on 4 GPUs of one node: a forward of 10 us, the activation sent on, a
    backward of 20 us, the gradient sent back, then the dp all-reduce, chained."""
    stage0 = RankProgram((0, 1), (
        comp(0, 10),
        p2p(1, NodeType.COMM_SEND, "pp+1", deps=[0]),
        p2p(2, NodeType.COMM_RECV, "pp+1"),
        comp(3, 20, deps=[2]),
        allreduce(4, deps=[3], ctrl=[1])))
    stage1 = RankProgram((2, 3), (
        p2p(0, NodeType.COMM_RECV, "pp-1"),
        comp(1, 10, deps=[0]),
        comp(2, 20, deps=[1]),
        p2p(3, NodeType.COMM_SEND, "pp-1", deps=[2]),
        allreduce(4, deps=[2], ctrl=[3])))
    return TraceJob(programs=(stage0, stage1), world_size=4, comm_groups=GROUPS,
                    group_name=lambda r, key: "1" if r < 2 else "2",
                    peer_rank=lambda r, key: r + 2 if key == "pp+1" else r - 2)


def test_a_two_stage_step_by_hand():
    bw = 400.0 * 2**30 / 1e9  # B/ns of the h100 preset's NVLink in ASTRA-sim's units
    send = math.floor(2 * 936.25 + MiB / bw)
    msg = MiB // 4 // 2  # 4 chunks, each cut in 2 around the ring
    chunk = 2 * (10 + math.floor(2 * 936.25 + msg / bw)) + 10 + 3 * math.floor(msg / 3350.0)
    ar = 4 * chunk
    assert (send, ar) == (4313, 18004)  # what the simulator gives (test_network.MEASURED)
    # stage 1 gets the activation at 10000 + send, runs 30 us, sends back, then reduces
    stage1 = 10_000 + send + 30_000 + send + ar
    # stage 0 runs its backward once the gradient is back, then reduces
    stage0 = 10_000 + send + 30_000 + send + 20_000 + ar
    est = estimate_job(two_stages(), H100)
    assert [c.finish_ns for c in est.classes] == [stage0, stage1]
    assert est.step_ns == stage0 == 86630
    first = est.classes[0]
    assert (first.compute_ns, first.exposed_comm_ns) == (30_000, send + ar)
    assert first.bubble_ns == stage0 - 30_000 - send - ar
    assert est.step_time_s == pytest.approx(86630e-9)


def test_a_deadlocked_job_is_refused():
    job = two_stages()
    stuck = RankProgram((0, 1), (p2p(0, NodeType.COMM_RECV, "pp+1"), comp(1, 10, deps=[0]),
                                 p2p(2, NodeType.COMM_SEND, "pp+1", deps=[1])))
    job.programs = (stuck, job.programs[1])
    with pytest.raises(ValueError, match="never finish"):
        estimate_job(job, H100)


@pytest.fixture
def estimate_host():
    from stage_search import plugin

    return fresh_host((toy_plugin, "toy"), (plugin, "search"), (Hardware(), "hw"))


def test_one_gpu_steps_for_its_kernels_alone(estimate_host, capsys):
    """Without communication the step is the compute: every kernel's whole microseconds,
    a kernel of 0 taken as 1 ns (ASTRA-sim's Workload::issue_replay)."""
    assert main(["estimate", "--model", "toy", "--gpu", "h100", "--json"], host=estimate_host) == 0
    got = json.loads(capsys.readouterr().out)
    result = plan_job(estimate_host, "toy", {}, Plan(), H100)
    nodes = [n for n in result.job.programs[0].nodes if n.type == NodeType.COMP]
    zeros = sum(1 for n in nodes if n.duration_micros == 0)
    expected = (result.manifest["rank_classes"][0]["compute_time_us"] * 1000 + zeros) * 1e-9
    assert got["step_time_s"] == pytest.approx(expected, rel=1e-12)
    assert got["rank_classes"][0]["exposed_comm_s"] == 0
    assert 0 < got["mfu"] < 1 and got["memory_bytes"] == result.manifest["rank_classes"][0]["memory_bytes"]["total"]
    # the hardware and compute model that timed it, and hardware TFLOP/s (every matmul) beside model TFLOP/s
    flops = result.manifest["rank_classes"][0]["flops"]
    assert (got["hardware"], got["compute_model"]) == ("h100", H100.gpu.compute_model)
    assert got["hardware_tflops_per_gpu"] == pytest.approx(flops["matmul"] / expected / 1e12, rel=1e-12)
    assert got["model_tflops_per_gpu"] == pytest.approx(flops["model"] / expected / 1e12, rel=1e-12)


def test_serving_is_refused_with_the_reason(estimate_host, capsys):
    assert main(["estimate", "--model", "toy", "--task", "serve", "--gpu", "h100"], host=estimate_host) == 2
    assert "estimate each side" in capsys.readouterr().err


class _Limited:
    """Two simulators: one that stops at 1 us of simulated time, one with no limit."""

    @staticmethod
    @hookimpl
    def stage_simulators():
        return [SimulatorSpec(name="stops-at-1us", simulate=lambda d, hw: {}, available=lambda: None,
                              time_limit_s=1e-6),
                SimulatorSpec(name="no-limit", simulate=lambda d, hw: {}, available=lambda: None)]


def test_the_estimate_says_which_simulators_stop_before_the_step_ends(capsys):
    """The toy step takes more than 1 us: a simulator that stops there is named, one without
    a limit is not (htsim registers 4 s: stage-adapter-astrasim)."""
    from stage_search import plugin

    host = fresh_host((toy_plugin, "toy"), (plugin, "search"), (Hardware(), "hw"), (_Limited(), "limited"))
    assert main(["estimate", "--model", "toy", "--gpu", "h100", "--json"], host=host) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["step_time_s"] > 1e-6
    assert got["past_time_limits"] == [{"simulator": "stops-at-1us", "time_limit_s": 1e-6}]
    assert main(["estimate", "--model", "toy", "--gpu", "h100"], host=host) == 0
    assert ("note: simulator stops-at-1us runs steps of at most 1e-06 s of simulated time: this step "
            f"({got['step_time_s']:.4g} s) would not finish in it") in capsys.readouterr().out
