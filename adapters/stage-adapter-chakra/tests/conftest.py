"""A small hand-built job: 4 ranks, pp=2 x dp=2, two rank classes.

Ranks 0,1 are pipeline stage 0 and ranks 2,3 stage 1 (rank = stage*2 + dp index).
Groups: "dp" {0,1} -> "1", {2,3} -> "2"; "pp" {0,2} -> "3", {1,3} -> "4".
Peers: "pp+1" = rank + 2, "pp-1" = rank - 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from stage_core.api import CollectiveType, NodeType, ProgramNode, RankProgram, TraceJob

DATA = Path(__file__).parent / "data"
SAMPLES = DATA / "chakra-allreduce-8npu"

GROUPS = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}

GIB = 1 << 30
BIG_FLOPS = 3 * (1 << 40) + 12345  # > 2**32, several varint bytes


def group_name(rank: int, key: str) -> str:
    stage, dp = divmod(rank, 2)
    if key == "dp":
        return str(1 + stage)
    if key == "pp":
        return str(3 + dp)
    raise KeyError(key)


def peer_rank(rank: int, key: str) -> int:
    return {"pp+1": rank + 2, "pp-1": rank - 2}[key]


def _comp(i, name, deps, flops, size, ctrl=(), micros=0):
    return ProgramNode(id=i, name=name, type=NodeType.COMP, data_deps=deps, ctrl_deps=ctrl,
                       num_ops=flops, tensor_size=size, flops_kind="matmul", duration_micros=micros)


def _coll(i, name, deps, kind, size, group, ctrl=()):
    return ProgramNode(id=i, name=name, type=NodeType.COMM_COLL, data_deps=deps,
                       ctrl_deps=ctrl, comm_type=kind, comm_size=size, group=group)


def _p2p(i, name, deps, kind, peer, tag, size):
    return ProgramNode(id=i, name=name, type=kind, data_deps=deps, peer=peer, tag=tag,
                       comm_size=size)


def stage0() -> RankProgram:
    return RankProgram(ranks=(0, 1), label="stage0", nodes=(
        _comp(0, "fwd_layer0", (), BIG_FLOPS, 6 * GIB, micros=21_000),
        _coll(1, "tp_allgather", (0,), CollectiveType.ALL_GATHER, 4096, "pp"),
        _p2p(2, "send_act", (1,), NodeType.COMM_SEND, "pp+1", 11, 8 * GIB),
        _p2p(3, "recv_grad", (2,), NodeType.COMM_RECV, "pp+1", 12, 8 * GIB),
        _comp(4, "bwd_layer0", (3,), 2 * BIG_FLOPS, 5 * GIB, ctrl=(2,), micros=3 * (1 << 32)),
        _coll(5, "dp_allreduce", (4,), CollectiveType.ALL_REDUCE, 3 * GIB, "dp"),
        _coll(6, "world_barrier_ar", (5,), CollectiveType.ALL_REDUCE, 1, None),
        _comp(300, "optimizer", (5, 6), 10**6, 2 * GIB),
    ))


def stage1() -> RankProgram:
    return RankProgram(ranks=(2, 3), label="stage1", nodes=(
        _p2p(0, "recv_act", (), NodeType.COMM_RECV, "pp-1", 11, 8 * GIB),
        _comp(1, "fwd_layer1", (0,), BIG_FLOPS, 6 * GIB),
        _coll(2, "tp_allgather", (1,), CollectiveType.ALL_GATHER, 4096, "pp"),
        _comp(3, "bwd_layer1", (2,), 2 * BIG_FLOPS, 5 * GIB),
        _p2p(4, "send_grad", (3,), NodeType.COMM_SEND, "pp-1", 12, 8 * GIB),
        _coll(5, "dp_reducescatter", (3,), CollectiveType.REDUCE_SCATTER, 3 * GIB, "dp"),
        _coll(6, "world_barrier_ar", (5,), CollectiveType.ALL_REDUCE, 1, None, ctrl=(4,)),
        _coll(7, "dp_allgather", (6,), CollectiveType.ALL_GATHER, 3 * GIB // 2, "dp"),
    ))


def make_job() -> TraceJob:
    return TraceJob(programs=(stage1(), stage0()), world_size=4, comm_groups=GROUPS,
                    group_name=group_name, peer_rank=peer_rank, name="test-pp2-dp2")


@pytest.fixture
def job() -> TraceJob:
    return make_job()


@pytest.fixture
def make_job_fn():
    """The builder itself, for tests that need two independent copies."""
    return make_job


@pytest.fixture
def samples_dir() -> Path:
    return SAMPLES
