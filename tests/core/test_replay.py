"""The replay of ASTRA-sim's issue rules: hand-worked sets, durations, and one process
per rank class giving exactly what one process per rank gives.

Each verdict here is worked out by hand from the rules as astra-sim 518bd513 codes
them (workload/Workload.cc issues ready nodes in ascending id; HardwareResource.cc
keeps one compute and one communication node in flight, receives exempt;
CongestionUnawareNetworkApi::sim_send completes a send on its own).  The integration
tests give the same kinds of sets to the real simulator.
"""

from __future__ import annotations

import functools
import random

import pytest

import stage_core.validate as validate_package
from stage_core.trace import CollectiveType as CT
from stage_core.trace import NodeType, TraceNode, TraceSet
from stage_core.validate import examine, validate
from stage_core.validate.replay import Links, build_program, run
from stage_core.validate.verdict import decide


def comp(nid, deps=(), ctrl=(), num_ops=1000):
    return TraceNode(nid, f"comp{nid}", NodeType.COMP, list(deps), list(ctrl), {
        "is_cpu_op": ("bool_val", False), "num_ops": ("int64_val", num_ops),
        "tensor_size": ("uint64_val", 64)})


def coll(nid, pg, size=4096, deps=(), ctrl=(), ctype=CT.ALL_REDUCE):
    return TraceNode(nid, f"coll{nid}", NodeType.COMM_COLL, list(deps), list(ctrl), {
        "is_cpu_op": ("bool_val", False), "comm_type": ("int64_val", int(ctype)),
        "comm_size": ("int64_val", size), "pg_name": ("string_val", pg)})


def send(nid, dst, tag=7, deps=(), ctrl=()):
    return TraceNode(nid, f"send{nid}", NodeType.COMM_SEND, list(deps), list(ctrl), {
        "is_cpu_op": ("bool_val", False), "comm_dst": ("int32_val", dst),
        "comm_tag": ("int32_val", tag), "comm_size": ("int64_val", 2048)})


def recv(nid, src, tag=7, deps=(), ctrl=()):
    return TraceNode(nid, f"recv{nid}", NodeType.COMM_RECV, list(deps), list(ctrl), {
        "is_cpu_op": ("bool_val", False), "comm_src": ("int32_val", src),
        "comm_tag": ("int32_val", tag), "comm_size": ("int64_val", 2048)})


def make(ranks, groups):
    return TraceSet(len(ranks), groups, lambda: iter(sorted(ranks.items())))


PAIR = {"1": [0, 1]}


# --------------------------------------------------------------------------- the slot rule


def test_a_send_behind_a_collective_that_needs_it_deadlocks():
    # Rank 0's all-reduce is ready at once and takes the communication slot; its send
    # becomes ready after comp0 and waits for the slot.  Rank 1 joins the all-reduce
    # only after receiving that send.  No rank finishes.
    ranks = {0: [comp(0), coll(1, "1"), send(2, 1, deps=[0])],
             1: [recv(0, 0), coll(1, "1", deps=[0])]}
    report = examine(make(ranks, PAIR))
    assert report.verdict.unfinished == (0, 1)
    assert not report.verdict.timing_independent  # rank 0's send and all-reduce
    [problem] = report.problems
    assert (problem.rank, problem.node_id) == (0, 1)
    assert problem.reason == (
        "never finishes in ASTRA-sim (nor does rank 1): it waits on rank 1 to issue its "
        "collective #0 on group '1', node 1 (coll1), which rank 1 never reaches: it waits "
        "on node 0 (recv0), which waits on rank 0's send, node 2 (send2), which waits for "
        "the communication slot, held by node 1 (coll1, collective #0 on group '1') above "
        "(as replayed with every node taking equal time: the sends and collectives of "
        "rank 0 are not ordered by their dependencies, so the simulator's timing decides "
        "their order)")


def test_the_same_exchange_chained_send_first_finishes():
    # what lowering emits: the all-reduce waits (ctrl_deps) on the send before it
    ranks = {0: [comp(0), send(1, 1, deps=[0]), coll(2, "1", ctrl=[1])],
             1: [recv(0, 0), coll(1, "1", deps=[0])]}
    report = examine(make(ranks, PAIR))
    assert report.problems == []
    assert report.verdict.finishes and report.verdict.timing_independent


def test_receives_take_no_slot():
    # rank 1 posts a receive and holds its slot with an all-reduce rank 0 joins only
    # after its send: the receive still completes
    ranks = {0: [send(0, 1), coll(1, "1", ctrl=[0])],
             1: [recv(0, 0), coll(1, "1"), comp(2, deps=[0, 1])]}
    assert examine(make(ranks, PAIR)).verdict.finishes


# --------------------------------------------------------------------------- partners


def test_a_send_without_a_receive_completes_on_its_own():
    # sends are eager: the sender finishes; validate still names the stray send
    ranks = {0: [comp(0), send(1, 1, deps=[0])], 1: [comp(0)]}
    report = examine(make(ranks, PAIR))
    assert report.verdict.finishes
    assert [p.node_id for p in report.problems] == [1]
    assert "has no matching recv" in report.problems[0].reason


def test_a_receive_without_a_send_stops_its_rank_and_those_waiting_on_it():
    ranks = {0: [comp(0), coll(1, "1", deps=[0])],
             1: [recv(0, 0), coll(1, "1", deps=[0])],
             2: [comp(0)]}
    report = examine(make(ranks, {"1": [0, 1]}))
    assert report.verdict.unfinished == (0, 1)


def test_a_member_short_of_a_collective_leaves_the_others_waiting():
    # collective #0 on group "1" meets; rank 0's #1 has no partner on rank 1
    ranks = {0: [coll(0, "1"), coll(1, "1", ctrl=[0])], 1: [coll(0, "1")]}
    report = examine(make(ranks, PAIR))
    assert report.verdict.unfinished == (0,)
    # the k-th collectives meet whatever their node ids: rank 1's only one, dropped
    # from the front, meets rank 0's first, of the same type and size
    ranks = {0: [coll(0, "1"), coll(1, "1", ctrl=[0])], 1: [coll(1, "1")]}
    assert examine(make(ranks, PAIR)).verdict.unfinished == (0,)


def test_collectives_of_different_sizes_never_complete():
    ranks = {0: [coll(0, "1", size=4096)], 1: [coll(0, "1", size=8192)]}
    report = examine(make(ranks, PAIR))
    assert report.verdict.unfinished == (0, 1)
    assert "collective #0 on group '1' is ALL_REDUCE of 8192 bytes here" in \
        report.problems[0].reason


def test_a_rank_stuck_on_a_dependency_cycle_still_prints_finished():
    # Workload::call reports a rank finished once nothing is ready or in flight: rank
    # 0's nodes 1-3 never run, yet it "finishes"; rank 1 waits in the all-reduce
    ranks = {0: [comp(0), comp(1, deps=[0, 2]), comp(2, deps=[1]), coll(3, "1", deps=[2])],
             1: [coll(0, "1")]}
    report = examine(make(ranks, PAIR))
    assert report.verdict.unfinished == (1,)
    assert report.problems[0].reason.startswith("dependency cycle 1 -> 2 -> 1")


def test_a_set_the_simulator_cannot_run_is_not_replayed():
    ranks = {0: [comp(0, num_ops=0)], 1: [comp(0)]}
    assert examine(make(ranks, PAIR)).verdict is None


# --------------------------------------------------------------------------- durations


def test_durations_time_each_node_under_the_slots():
    # rank 0: comp0 (5) and comp1 (4) share the compute slot, ascending id: 0-5, 5-9;
    # send2 (3) after comp0: 5-8; coll3 after comp1: issued at 9.
    # rank 1: recv0 completes when the data arrives, at 8; comp1 (2): 8-10; coll2
    # issued at 10; the all-reduce (6 on both) then ends at 16 on both ranks.
    p0 = build_program([comp(0), comp(1), send(2, 1, deps=[0]), coll(3, "1", deps=[1])])
    p1 = build_program([recv(0, 0), comp(1, deps=[0]), coll(2, "1", deps=[1])])
    links = Links(rendezvous=[{3: 0}, {2: 0}], members=[((0, 3), (1, 2))], complete=[True],
                  sender=[{}, {0: (0, 2)}])
    took = {(0, 0): 5, (0, 1): 4, (0, 2): 3, (0, 3): 6, (1, 1): 2, (1, 2): 6}
    replay = run([p0, p1], links, lambda p, pos: took[(p, pos)])
    assert replay.finish == [16, 16]
    untimed = run([p0, p1], links)  # every node 1: comp 0-1, 1-2; send 1-2; coll at 2
    assert untimed.finish == [4, 4]  # rank 1: recv at 2, comp 2-3, coll issued 3, ends 4


# --------------------------------------------------------------------------- classes


def ring_set(rng=None, per_stage=4, stages=3):
    """A pipeline of ``stages`` stages of ``per_stage`` ranks (rank = t + 4s): per
    micro-batch a receive, a compute, a tp all-reduce and a send, each node after the
    one before; the first and last stage end with an embedding all-reduce.

    With ``rng``, each stage's nodes are changed alike on all its ranks: some become
    roots (their order then races), a send's tag changes, an embedding all-reduce
    changes its size.
    """
    world = per_stage * stages
    groups = {str(1 + s): [t + per_stage * s for t in range(per_stage)] for s in range(stages)}
    last = per_stage * (stages - 1)
    groups.update({str(10 + t): [t, last + t] for t in range(per_stage)})
    changes = [[(rng.randrange(8), rng.randrange(3)) for _ in range(rng.randrange(3))]
               for _ in range(stages)] if rng else [[] for _ in range(stages)]
    ranks = {}
    for r in range(world):
        t, s = r % per_stage, r // per_stage
        nodes = []
        for m in range(2):
            if s > 0:
                nodes.append(recv(len(nodes), r - per_stage, tag=m))
            nodes.append(comp(len(nodes)))
            nodes.append(coll(len(nodes), str(1 + s)))
            if s < stages - 1:
                nodes.append(send(len(nodes), r + per_stage, tag=m))
        if s in (0, stages - 1):
            nodes.append(coll(len(nodes), str(10 + t), size=1 << 20))
        for pos, node in enumerate(nodes[1:], 1):
            node.data_deps.append(pos - 1)
        for pos, how in changes[s]:
            node = nodes[pos % len(nodes)]
            if how == 0:
                node.data_deps.clear()
            elif how == 1 and node.type == NodeType.COMM_SEND:
                node.attrs["comm_tag"] = ("int32_val", 5)
            elif how == 2 and node.attrs.get("pg_name", ("", ""))[1].startswith("1") \
                    and len(node.attrs["pg_name"][1]) == 2:
                node.attrs["comm_size"] = ("int64_val", 1 << 19)
        ranks[r] = nodes
    return make(ranks, groups)


def test_one_process_per_stage_when_the_classes_meet_alike():
    report = examine(ring_set())
    assert report.problems == []
    verdict = report.verdict
    assert verdict.finishes and verdict.timing_independent
    assert verdict.per_class and verdict.processes == 3


@pytest.mark.parametrize("seed", range(40))
def test_per_class_replay_equals_per_rank_replay(seed, monkeypatch):
    rng = random.Random(seed)
    trace_set = ring_set(rng)
    fast = examine(trace_set)
    monkeypatch.setattr(validate_package, "decide", functools.partial(decide, per_class=False))
    slow = examine(trace_set)
    assert not slow.verdict.per_class and slow.verdict.processes == 12
    assert fast.verdict.per_class
    assert (fast.verdict.unfinished, fast.verdict.timing_independent, fast.problems) == \
        (slow.verdict.unfinished, slow.verdict.timing_independent, slow.problems)


def test_ranks_of_one_program_meeting_unlike_are_replayed_one_by_one():
    # three ranks, one program (A then B), groups crossing: rank 2's A is collective
    # #0 on group "3" together with rank 1's B.  Position 0 meets position 0 on group
    # "1" but position 1 on group "3": no process per class can stand for them.
    ranks = {0: [coll(0, "1"), coll(1, "2", ctrl=[0])],
             1: [coll(0, "1"), coll(1, "3", ctrl=[0])],
             2: [coll(0, "3"), coll(1, "2", ctrl=[0])]}
    verdict = examine(make(ranks, {"1": [0, 1], "2": [0, 2], "3": [1, 2]})).verdict
    assert not verdict.per_class and verdict.processes == 3
    assert verdict.finishes  # 0,1 meet on "1"; then 1,2 on "3"; then 0,2 on "2"


def test_validate_reports_the_deadlock_alone():
    ranks = {0: [comp(0), coll(1, "1"), send(2, 1, deps=[0])],
             1: [recv(0, 0), coll(1, "1", deps=[0])]}
    assert [p.rank for p in validate(make(ranks, PAIR))] == [0]


def test_a_program_is_reused_only_for_the_very_same_nodes():
    nodes = [comp(0), coll(1, "1", deps=[0]), send(2, 1, deps=[1]), recv(3, 1), comp(4, deps=[2, 3])]
    program = build_program(nodes)
    assert program.built_from(nodes)
    assert program.built_from([*nodes[:1], coll(1, "2", deps=[0]), *nodes[2:]])  # pg_name: per rank
    for changed in (coll(1, "1", deps=[0], size=8192), coll(1, "1", ctrl=[0]),
                    send(1, 1, deps=[0]), comp(1, deps=[0])):
        assert not program.built_from([*nodes[:1], changed, *nodes[2:]]), changed
    renamed = TraceNode(4, "other", NodeType.COMP, [2, 3], [], dict(nodes[4].attrs))
    assert not program.built_from([*nodes[:4], renamed])
    assert not build_program(nodes[::-1]).built_from(nodes[::-1])  # (ids out of order: built)
