"""Tests of the trace validator: a valid set passes, each defect is named precisely.

The base set has 4 ranks, tp2 x pp2: ranks 0 and 1 are pipeline stage 0, ranks 2 and
3 stage 1.  Groups: "1" = tp of stage 0, "2" = tp of stage 1, "3" = all four ranks
(an all-gather standing in for a data-parallel sync).  Stage 0 sends an activation to
the same tp position of stage 1 (rank r -> r + 2, tag 7, 2048 bytes).
"""

from __future__ import annotations

import pytest

from stage_core.errors import TraceError
from stage_core.trace import CollectiveType as CT
from stage_core.trace import NodeType, TraceNode, TraceSet
from stage_core.validate import ATTR_KINDS, Problem, check, validate

GROUPS = {"1": [0, 1], "2": [2, 3], "3": [0, 1, 2, 3]}


def comp(nid, deps=(), name=None, num_ops=1000, tensor_size=64, ctrl=()):
    return TraceNode(nid, name or f"comp{nid}", NodeType.COMP, list(deps), list(ctrl), {
        "is_cpu_op": ("bool_val", False),
        "num_ops": ("int64_val", num_ops),
        "tensor_size": ("uint64_val", tensor_size),
    })


def coll(nid, pg, ctype=CT.ALL_REDUCE, size=4096, deps=(), name=None):
    return TraceNode(nid, name or f"coll{nid}", NodeType.COMM_COLL, list(deps), [], {
        "is_cpu_op": ("bool_val", False),
        "comm_type": ("int64_val", int(ctype)),
        "comm_size": ("int64_val", size),
        "pg_name": ("string_val", pg),
    })


def send(nid, dst, tag=7, size=2048, deps=()):
    return TraceNode(nid, f"send{nid}", NodeType.COMM_SEND, list(deps), [], {
        "is_cpu_op": ("bool_val", False),
        "comm_dst": ("int32_val", dst),
        "comm_tag": ("int64_val", tag),
        "comm_size": ("int64_val", size),
    })


def recv(nid, src, tag=7, size=2048, deps=()):
    return TraceNode(nid, f"recv{nid}", NodeType.COMM_RECV, list(deps), [], {
        "is_cpu_op": ("bool_val", False),
        "comm_src": ("uint32_val", src),
        "comm_tag": ("sint32_val", tag),
        "comm_size": ("int64_val", size),
    })


def stage0(rank):
    return [
        comp(0),
        coll(1, "1", CT.ALL_REDUCE, 4096, deps=[0]),
        comp(2, deps=[1]),
        send(3, rank + 2, deps=[2]),
        comp(4, deps=[2], ctrl=[3]),
        coll(5, "3", CT.ALL_GATHER, 1024, deps=[4]),
    ]


def stage1(rank):
    return [
        recv(0, rank - 2),
        comp(1, deps=[0]),
        coll(2, "2", CT.ALL_REDUCE, 4096, deps=[1]),
        comp(3, deps=[2]),
        coll(4, "3", CT.ALL_GATHER, 1024, deps=[3]),
    ]


def base():
    return {0: stage0(0), 1: stage0(1), 2: stage1(2), 3: stage1(3)}


def make(ranks, groups=None, world_size=4):
    groups = GROUPS if groups is None else groups
    return TraceSet(world_size, groups, lambda: iter(sorted(ranks.items())))


def node(ranks, rank, nid):
    return next(n for n in ranks[rank] if n.id == nid)


def at(problems, rank, node_id):
    """Reasons of the problems at (rank, node_id)."""
    return [p.reason for p in problems if p.rank == rank and p.node_id == node_id]


def only(problems):
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


# --------------------------------------------------------------------------- valid sets


def test_valid_set_has_no_problems():
    assert validate(make(base())) == []
    check(make(base()))  # does not raise


def test_independent_groups_may_be_issued_in_different_orders():
    # stage 1 issues the all-gather before its tp all-reduce; no rank is in both
    # tp groups, so no cycle: ranks 2, 3 wait in "3" until 0, 1 finish "1"
    ranks = base()
    for r in (2, 3):
        ranks[r] = [recv(0, r - 2), comp(1, deps=[0]), coll(2, "3", CT.ALL_GATHER, 1024,
                    deps=[1]), comp(3, deps=[2]), coll(4, "2", CT.ALL_REDUCE, 4096, deps=[3])]
    assert validate(make(ranks)) == []


def test_iterates_ranks_once():
    calls = []

    def iter_ranks():
        calls.append(1)
        return iter(sorted(base().items()))

    assert validate(TraceSet(4, GROUPS, iter_ranks)) == []
    assert calls == [1]


def test_attr_table_covers_every_accepted_node_type():
    assert set(ATTR_KINDS) == {NodeType.COMP, NodeType.COMM_COLL, NodeType.COMM_SEND,
                               NodeType.COMM_RECV}
    for spec in ATTR_KINDS.values():
        assert spec["is_cpu_op"] == {"bool_val"}
        if "comm_size" in spec:
            assert spec["comm_size"] == {"int64_val"}


# --------------------------------------------------------------------------- problems


def test_problem_text_names_rank_node_and_reason():
    ranks = base()
    bad = node(ranks, 3, 2)
    bad.name = "attn.qkv.fwd"
    bad.attrs["comm_size"] = ("uint64_val", 4096)
    problem = only(validate(make(ranks)))
    assert problem == Problem(3, 2, "attn.qkv.fwd", "comm_size is uint64_val, expected int64_val")
    assert str(problem) == ("rank 3, node 2 (attn.qkv.fwd): "
                            "comm_size is uint64_val, expected int64_val")
    assert str(Problem(3, None, "", "no root")) == "rank 3: no root"
    assert str(Problem(None, None, "", "bad group")) == "trace set: bad group"


def test_check_raises_trace_error_with_the_problems():
    ranks = base()
    node(ranks, 0, 0).attrs["tensor_size"] = ("int64_val", 0)
    with pytest.raises(TraceError) as caught:
        check(make(ranks))
    assert [str(p) for p in caught.value.problems] == [
        "rank 0, node 0 (comp0): tensor_size is 0, expected > 0"]


def test_max_problems_caps_the_list_and_counts_the_rest():
    ranks = base()
    for n in ranks[0] + ranks[1]:
        if n.type == NodeType.COMP:
            n.attrs["tensor_size"] = ("int64_val", 0)  # 6 problems
    problems = validate(make(ranks), max_problems=4)
    assert len(problems) == 5
    assert all("tensor_size is 0" in p.reason for p in problems[:4])
    assert problems[4].rank is None
    assert problems[4].reason == "2 more problems not listed (max_problems=4)"


# --------------------------------------------------------------------------- one rank: graph


def test_duplicate_node_id():
    ranks = base()
    ranks[1].append(comp(2, deps=[0], name="extra"))
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id, problem.node_name) == (1, 2, "extra")
    assert problem.reason == "duplicate node id 2 (also 'comp2')"


def test_missing_data_dependency():
    ranks = base()
    node(ranks, 2, 3).data_deps = [99]
    assert at(validate(make(ranks)), 2, 3) == ["data_deps names node 99, which does not exist"]


def test_missing_ctrl_dependency():
    ranks = base()
    node(ranks, 0, 4).ctrl_deps = [3, 42]
    assert only(validate(make(ranks))).reason == "ctrl_deps names node 42, which does not exist"


def test_dependency_cycle_names_its_nodes():
    ranks = base()
    node(ranks, 0, 1).ctrl_deps = [2]  # 1 waits on 2, which waits on 1
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (0, 1)
    assert problem.reason.startswith("dependency cycle 1 -> 2 -> 1 ")
    assert "5 nodes never run" in problem.reason  # 1, 2 and what follows them: 3, 4, 5


def test_self_dependency_is_a_cycle():
    ranks = base()
    node(ranks, 2, 3).ctrl_deps = [3]
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (2, 3)
    assert problem.reason.startswith("dependency cycle 3 -> 3 ")


def test_long_chain_cycle_needs_no_recursion():
    n = 50_000  # far deeper than Python's recursion limit
    chain = [comp(i, deps=[i - 1] if i else []) for i in range(n)]
    chain[0].ctrl_deps = [n - 1]
    problems = validate(make({0: chain}, groups={}, world_size=1))
    assert [p.reason for p in problems] == [
        "no root: every node has a dependency, so none can start",
        "dependency cycle 0 -> 1 -> 2 -> 3 -> 4 -> 5 -> ... 49989 more ... -> 49995 -> "
        "49996 -> 49997 -> 49998 -> 49999 -> 0 (each node waits on the one before it; "
        "50000 nodes never run)",
    ]


def test_no_root():
    ranks = base()
    node(ranks, 3, 0).ctrl_deps = [4]  # the recv, the only root, now waits on the end
    problems = validate(make(ranks))
    assert at(problems, 3, None) == ["no root: every node has a dependency, so none can start"]
    assert any(r.startswith("dependency cycle 0 -> 1 -> 2 -> 3 -> 4 -> 0")
               for r in at(problems, 3, 0))


def test_empty_rank():
    ranks = base()
    ranks[2] = []
    problems = validate(make(ranks))
    assert at(problems, 2, None)[0] == "the trace has no nodes"


def test_unsupported_node_type():
    ranks = base()
    ranks[0].append(TraceNode(9, "load", NodeType.MEM_LOAD, [0], [], {}))
    assert only(validate(make(ranks))).reason == (
        "node type MEM_LOAD (2) is not one of COMP, COMM_COLL, COMM_SEND, COMM_RECV")


# --------------------------------------------------------------------------- one rank: attributes


def test_comm_node_with_is_cpu_op_true():
    ranks = base()
    node(ranks, 1, 3).attrs["is_cpu_op"] = ("bool_val", True)
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (1, 3)
    assert problem.reason == "is_cpu_op is true, expected false on a comm node"


def test_comm_node_with_is_cpu_op_unset():
    ranks = base()
    del node(ranks, 2, 2).attrs["is_cpu_op"]
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (2, 2)
    assert problem.reason == "is_cpu_op is missing, expected bool_val"


def test_is_cpu_op_must_be_a_bool():
    ranks = base()
    node(ranks, 0, 2).attrs["is_cpu_op"] = ("int64_val", 0)
    assert only(validate(make(ranks))).reason == "is_cpu_op is int64_val, expected bool_val"


def test_comm_size_as_uint64_on_send():
    ranks = base()
    node(ranks, 0, 3).attrs["comm_size"] = ("uint64_val", 2048)
    problem = only(validate(make(ranks)))  # the values still match the recv
    assert (problem.rank, problem.node_id) == (0, 3)
    assert problem.reason == "comm_size is uint64_val, expected int64_val"


def test_comm_size_zero():
    ranks = base()
    for r in (0, 1):
        node(ranks, r, 1).attrs["comm_size"] = ("int64_val", 0)
    problems = validate(make(ranks))
    assert len(problems) == 2
    assert at(problems, 0, 1) == ["comm_size is 0, expected > 0"]
    assert at(problems, 1, 1) == ["comm_size is 0, expected > 0"]


def test_num_ops_as_double():
    ranks = base()
    node(ranks, 3, 1).attrs["num_ops"] = ("double_val", 1000.0)
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (3, 1)
    assert problem.reason.startswith("num_ops is double_val, expected an integer kind")


def test_tensor_size_zero():
    ranks = base()
    node(ranks, 2, 3).attrs["tensor_size"] = ("int64_val", 0)
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id, problem.reason) == (
        2, 3, "tensor_size is 0, expected > 0")


def test_num_ops_zero():
    ranks = base()
    node(ranks, 0, 0).attrs["num_ops"] = ("int64_val", 0)
    assert only(validate(make(ranks))).reason == "num_ops is 0, expected > 0"


def test_missing_comm_tag():
    ranks = base()
    del node(ranks, 2, 0).attrs["comm_tag"]
    problems = validate(make(ranks))
    assert at(problems, 2, 0) == ["comm_tag is missing, expected an integer kind "
                                  "(int64_val, uint64_val, int32_val, ...)"]


# --------------------------------------------------------------------------- collectives


def test_pg_name_not_in_comm_groups():
    ranks = base()
    node(ranks, 1, 5).attrs["pg_name"] = ("string_val", "9")
    problems = validate(make(ranks))
    assert at(problems, 1, 5) == [
        "pg_name '9' is not in comm_groups (known: '1', '2', '3')"]


def test_pg_name_must_be_a_string():
    ranks = base()
    node(ranks, 1, 5).attrs["pg_name"] = ("int64_val", 3)
    assert "pg_name is int64_val, expected string_val" in at(validate(make(ranks)), 1, 5)


def test_rank_not_in_its_group():
    ranks = base()
    node(ranks, 0, 1).attrs["pg_name"] = ("string_val", "2")
    problems = validate(make(ranks))
    assert at(problems, 0, 1) == ["rank 0 is not a member of group '2' [2, 3]"]


def test_unsupported_collective_type():
    ranks = base()
    for r in (2, 3):
        node(ranks, r, 2).attrs["comm_type"] = ("int64_val", int(CT.BROADCAST))
    problems = validate(make(ranks))
    assert len(problems) == 2
    assert at(problems, 2, 2) == [
        "comm_type BROADCAST (5) is not simulated by ASTRA-sim; use ALL_REDUCE, "
        "ALL_GATHER, REDUCE_SCATTER or ALL_TO_ALL"]


def test_collective_type_differs_between_members():
    ranks = base()
    node(ranks, 1, 1).attrs["comm_type"] = ("int64_val", int(CT.ALL_GATHER))
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (1, 1)
    assert problem.reason == ("collective #0 on group '1' is ALL_GATHER of 4096 bytes "
                              "here but ALL_REDUCE of 4096 bytes on rank 0 (node 1)")


def test_collective_size_differs_between_members():
    ranks = base()
    node(ranks, 2, 4).attrs["comm_size"] = ("int64_val", 512)
    problem = only(validate(make(ranks)))  # the majority of group "3" says 1024
    assert (problem.rank, problem.node_id) == (2, 4)
    assert problem.reason == ("collective #0 on group '3' is ALL_GATHER of 512 bytes "
                              "here but ALL_GATHER of 1024 bytes on rank 0 (node 5)")


def test_odd_member_is_reported_not_the_majority():
    ranks = base()
    node(ranks, 0, 5).attrs["comm_size"] = ("int64_val", 512)
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (0, 5)
    assert "on rank 1 (node 5)" in problem.reason


def test_member_missing_a_collective():
    ranks = base()
    ranks[3] = ranks[3][:4]  # drops the all-gather on "3"
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (3, None)
    assert problem.reason == ("rank issues 0 collectives on group '3' but rank 0 issues 1; "
                              "missing collective #0 (ALL_GATHER of 1024 bytes, node 5 on "
                              "rank 0)")


def test_member_with_an_extra_collective():
    ranks = base()
    ranks[1].append(coll(6, "1", CT.REDUCE_SCATTER, 8192, deps=[5]))
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (1, 6)
    assert problem.reason == ("rank issues 2 collectives on group '1' but rank 0 issues 1; "
                              "collective #1 (REDUCE_SCATTER of 8192 bytes) has no partner")


def test_inconsistent_order_of_two_collectives_deadlocks():
    ranks = base()
    # rank 1 issues the all-gather on "3" before the all-reduce on "1"; rank 0 the
    # other way round: each waits for the other inside a different collective
    ranks[1] = [comp(0), coll(1, "3", CT.ALL_GATHER, 1024, deps=[0]), comp(2, deps=[1]),
                send(3, 3, deps=[2]), comp(4, deps=[2]),
                coll(5, "1", CT.ALL_REDUCE, 4096, deps=[4])]
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (0, 1)
    assert problem.reason == (
        "collectives deadlock, their order differs between ranks: "
        "rank 0 issues node 1 (collective #0 on group '1') before node 5 (collective #0 "
        "on group '3'); rank 1 issues node 1 (collective #0 on group '3') before node 5 "
        "(collective #0 on group '1')")


def test_deadlock_through_three_groups():
    # each rank is in two of three groups; their orders form a ring
    groups = {"1": [0, 1], "2": [1, 2], "3": [2, 0]}
    ranks = {
        0: [coll(0, "1"), coll(1, "3", deps=[0])],
        1: [coll(0, "2"), coll(1, "1", deps=[0])],
        2: [coll(0, "3"), coll(1, "2", deps=[0])],
    }
    problem = only(validate(make(ranks, groups, world_size=3)))
    assert problem.reason.startswith("collectives deadlock")
    for rank in range(3):
        assert f"rank {rank} issues" in problem.reason


# --------------------------------------------------------------------------- send / recv


def test_send_without_recv():
    ranks = base()
    ranks[2][0] = comp(0)
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (0, 3)
    assert problem.reason == "send to rank 2 (tag 7, 2048 bytes) has no matching recv on rank 2"


def test_recv_without_send():
    ranks = base()
    ranks[1][3] = comp(3, deps=[2])
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (3, 0)
    assert problem.reason == "recv from rank 1 (tag 7, 2048 bytes) has no matching send on rank 1"


def test_send_recv_tag_mismatch():
    ranks = base()
    node(ranks, 2, 0).attrs["comm_tag"] = ("int64_val", 8)
    problems = validate(make(ranks))
    assert len(problems) == 2
    assert at(problems, 0, 3) == [
        "send to rank 2 (tag 7, 2048 bytes) has no matching recv on rank 2; unmatched "
        "there: node 0 recv(src=0, tag 8, 2048 bytes), tag differs"]
    assert at(problems, 2, 0) == [
        "recv from rank 0 (tag 8, 2048 bytes) has no matching send on rank 0; unmatched "
        "there: node 3 send(dst=2, tag 7, 2048 bytes), tag differs"]


def test_send_recv_size_mismatch():
    ranks = base()
    node(ranks, 1, 3).attrs["comm_size"] = ("int64_val", 1024)
    problems = validate(make(ranks))
    assert len(problems) == 2
    assert at(problems, 1, 3)[0].endswith(
        "unmatched there: node 0 recv(src=1, tag 7, 2048 bytes), size differs")
    assert at(problems, 3, 0)[0].startswith(
        "recv from rank 1 (tag 7, 2048 bytes) has no matching send on rank 1")


def test_sends_match_as_a_multiset():
    ranks = base()
    ranks[0].append(send(6, 2, deps=[5]))  # a second identical send, one recv only
    problem = only(validate(make(ranks)))
    assert (problem.rank, problem.node_id) == (0, 6)
    assert problem.reason.startswith("send to rank 2 (tag 7, 2048 bytes) has no matching")


def test_send_to_a_rank_outside_the_world():
    ranks = base()
    node(ranks, 0, 3).attrs["comm_dst"] = ("int64_val", 4)
    problems = validate(make(ranks))
    assert at(problems, 0, 3) == ["comm_dst 4 is not a rank (world size 4)"]


def test_send_to_itself():
    ranks = base()
    node(ranks, 0, 3).attrs["comm_dst"] = ("int64_val", 0)
    assert at(validate(make(ranks)), 0, 3) == ["comm_dst 0 is the rank itself"]


# --------------------------------------------------------------------------- the set


def test_missing_rank():
    ranks = base()
    del ranks[3]
    problems = validate(make(ranks))
    assert at(problems, 3, None)[0] == "no trace for this rank"


def test_rank_twice():
    ranks = base()
    pairs = sorted(ranks.items()) + [(2, stage1(2))]
    problems = validate(TraceSet(4, GROUPS, lambda: iter(pairs)))
    assert at(problems, 2, None) == ["rank appears twice in the trace set"]


def test_bad_group_definitions():
    groups = dict(GROUPS, **{"0": [0], "x": [1], "5": [1, 7], "6": [2, 2]})
    reasons = [p.reason for p in validate(make(base(), groups)) if p.rank is None]
    assert reasons == [
        "comm group name '0' is not a decimal string > 0",
        "comm group name 'x' is not a decimal string > 0",
        "comm group '5' names ranks [7] outside 0..3",
        "comm group '6' lists a rank twice: [2, 2]",
    ]


# --------------------------------------------------------------------------- reuse across ranks
#
# A reader may hand out one TraceNode object for equal nodes (the chakra reader does
# for equal records), and the validator then checks the structure of a rank class
# once.  These sets are built that way: 8 ranks, tp4 x dp2, two classes (ranks 0-3
# send to r + 4 after their dp all-reduce, ranks 4-7 receive from r - 4 what their
# compute after it needs); compute nodes are shared objects within a class, comm
# nodes are per rank.  Groups "1" = ranks 0-3, "2" = ranks 4-7, "3".."6" = {r, r + 4}.

import copy  # noqa: E402
import random  # noqa: E402

from stage_core.validate import groups as groups_module  # noqa: E402
from stage_core.validate import ranks as ranks_module  # noqa: E402
from stage_core.validate import shapes as shapes_module  # noqa: E402
from stage_core.validate import structure as structure_module  # noqa: E402

CLASS_GROUPS = {"1": [0, 1, 2, 3], "2": [4, 5, 6, 7], "3": [0, 4], "4": [1, 5],
                "5": [2, 6], "6": [3, 7]}


def class_ranks() -> dict[int, list[TraceNode]]:
    shared = {c: {i: comp(i, deps=[i - 1] if i else [], num_ops=100 * (i + 1))
                  for i in (1, 3, 5, 7, 8)} for c in "SR"}
    shared["S"][0] = comp(0)
    # the receive feeds node 8, after the dp all-reduce (node 6): were it to feed node
    # 1, ranks 4-7 could not join that all-reduce before rank r - 4 sends, and rank
    # r - 4 sends only after it (a deadlock)
    shared["R"][1] = comp(1, num_ops=200)
    shared["R"][8] = comp(8, deps=[7, 0], num_ops=900)
    ranks = {}
    for r in range(8):
        cls, tp, dp = "S" if r < 4 else "R", "1" if r < 4 else "2", str(3 + r % 4)
        mine = dict(shared[cls])
        mine[2] = coll(2, tp, CT.ALL_REDUCE, 4096, deps=[1])
        mine[4] = coll(4, tp, CT.ALL_REDUCE, 4096, deps=[3])
        mine[6] = coll(6, dp, CT.ALL_REDUCE, 8192, deps=[5])
        mine[9] = coll(9, dp, CT.ALL_GATHER, 1024, deps=[8])
        if cls == "S":
            mine[7] = send(7, r + 4, tag=9, deps=[6])
        else:
            mine[0] = recv(0, r - 4, tag=9)
        ranks[r] = [mine[i] for i in range(10)]
    return ranks


def class_set(ranks) -> TraceSet:
    return make(ranks, CLASS_GROUPS, world_size=8)


def replaced(ranks, rank, nid, **changes):
    """``ranks`` with node ``nid`` of ``rank`` (or the node object ``nid``) replaced by
    a changed copy (the shared original is left alone, as a reader's nodes must be)."""
    old = nid if isinstance(nid, TraceNode) else node(ranks, rank, nid)
    new = copy.deepcopy(old)
    attrs = changes.pop("attrs", {})
    for key, value in changes.items():
        setattr(new, key, value)
    for name, value in attrs.items():
        if value is None:
            new.attrs.pop(name, None)
        else:
            new.attrs[name] = value
    ranks[rank] = [new if n is old else n for n in ranks[rank]]
    return ranks


def reasons_by_rank(problems):
    return {(p.rank, p.node_id, p.reason) for p in problems}


@pytest.fixture
def structure_calls(monkeypatch):
    calls = []
    real = shapes_module.check_structure

    def counted(nodes, limit):
        calls.append(len(nodes))
        return real(nodes, limit)
    monkeypatch.setattr(shapes_module, "check_structure", counted)
    return calls


def test_class_set_is_valid_and_checked_once_per_class(structure_calls):
    assert validate(class_set(class_ranks())) == []
    assert len(structure_calls) == 2


def test_zero_tensor_size_on_one_rank_of_a_class(structure_calls):
    ranks = replaced(class_ranks(), 5, 3, attrs={"tensor_size": ("uint64_val", 0)})
    assert validate(class_set(ranks)) == [
        Problem(5, 3, "comp3", "tensor_size is 0, expected > 0")]
    assert len(structure_calls) == 3  # rank 5 is checked on its own


def test_duplicate_id_on_one_rank_of_a_class():
    ranks = replaced(class_ranks(), 2, 5, id=3)
    problems = validate(class_set(ranks))
    assert {p.rank for p in problems} == {2}
    assert (2, 3, "duplicate node id 3 (also 'comp3')") in reasons_by_rank(problems)


def test_pg_name_of_a_group_the_rank_is_not_in():
    # rank 6's second tp collective names the tp group of ranks 0-3: the set of
    # names per class is the same, so only the membership check can see it
    ranks = replaced(class_ranks(), 6, 4, attrs={"pg_name": ("string_val", "1")})
    problems = validate(class_set(ranks))
    assert {p.rank for p in problems} == {6}
    assert (6, 4, "rank 6 is not a member of group '1' [0, 1, 2, 3]") in \
        reasons_by_rank(problems)


def test_peer_that_is_the_rank_itself_on_one_rank():
    ranks = replaced(class_ranks(), 1, 7, attrs={"comm_dst": ("int32_val", 1)})
    problems = validate(class_set(ranks))
    assert (1, 7, "comm_dst 1 is the rank itself") in reasons_by_rank(problems)
    assert {p.rank for p in problems} == {1, 5}  # and rank 5's recv is left unmatched


def test_defect_shared_by_a_whole_class_is_reported_for_each_rank():
    ranks = class_ranks()
    shared = node(ranks, 0, 5)
    shared.attrs["tensor_size"] = ("uint64_val", 0)  # the one object of ranks 0-3
    assert validate(class_set(ranks)) == [
        Problem(r, 5, "comp5", "tensor_size is 0, expected > 0") for r in range(4)]


def test_true_is_not_taken_for_one():
    # equal under ==, but a bool comm_size is no number to the sequence check
    ranks = class_ranks()
    for r in range(8):
        ranks = replaced(ranks, r, 9, attrs={"comm_size": ("int64_val", 1)})
    assert validate(class_set(ranks)) == []
    ranks = replaced(ranks, 6, 9, attrs={"comm_size": ("int64_val", True)})
    problems = validate(class_set(ranks))
    assert problems and {p.rank for p in problems} == {6}


def test_problems_keep_their_order_within_a_rank():
    # structural and rank problems of one rank interleave by node, as checked
    ranks = replaced(class_ranks(), 1, 2, attrs={"pg_name": ("string_val", "9")})
    ranks = replaced(ranks, 1, 1, attrs={"num_ops": ("int64_val", 0)})
    ranks = replaced(ranks, 1, 4, attrs={"is_cpu_op": ("bool_val", True)})
    ranks = replaced(ranks, 1, 6, attrs={"pg_name": ("string_val", "2")})
    got = [(p.node_id, p.reason.split(" ")[0]) for p in validate(class_set(ranks))
           if p.rank == 1][:4]
    assert got == [(1, "num_ops"), (2, "pg_name"), (4, "is_cpu_op"), (6, "rank")]
    # a send's problem (node 7) before a collective's (node 9) on the same rank
    ranks = replaced(class_ranks(), 3, 9, attrs={"pg_name": ("string_val", "2")})
    ranks = replaced(ranks, 3, 7, attrs={"comm_dst": ("int32_val", 3)})
    got = [(p.node_id, p.reason.split(" ")[0]) for p in validate(class_set(ranks))
           if p.rank == 3][:2]
    assert got == [(7, "comm_dst"), (9, "rank")]


# A reference without any reuse or shortcut: every rank's structure checked on its
# own, every collective through the per-node code, every group compared in full, the
# order graph always built, and only the final list capped at max_problems.


def _every_group_in_full(groups, summaries, out):
    used = {}
    for summary in summaries.values():
        used.update(dict.fromkeys(summary.pg_names))
    for pg in used:
        members = [m for m in sorted(groups[pg]) if m in summaries]
        groups_module.check_sequences(pg, members, summaries, out)
    groups_module.check_collective_order(groups_module.issue_order(summaries), out)


def reference(trace_set, max_problems, monkeypatch):
    unbounded = structure_module.Recorder
    with monkeypatch.context() as m:
        for module in (structure_module, ranks_module):
            m.setattr(module, "Recorder", lambda limit: unbounded(1 << 30))
        m.setattr(shapes_module.Shapes, "shape",
                  lambda self, nodes: shapes_module.check_structure(tuple(nodes), self.limit))
        m.setattr(ranks_module, "_all_members", lambda *args: None)
        m.setattr(groups_module, "check_collectives", _every_group_in_full)
        return validate(trace_set, max_problems)


def _mutate(rng: random.Random, ranks: dict, groups=CLASS_GROUPS) -> dict:
    world = len(ranks)
    rank = rng.randrange(world)
    n = rng.choice(ranks[rank])
    nid, kind = n.id, n.type
    choices = [
        {"attrs": {"is_cpu_op": ("bool_val", True)}},
        {"attrs": {"is_cpu_op": None}},
        {"id": rng.choice([nid - 1, nid + 1, 42])},
        {"data_deps": [rng.choice([nid, nid + 1, 77])]},
        {"ctrl_deps": [9 - nid] if nid != 9 else [0]},
        {"data_deps": [], "ctrl_deps": []},
        {"name": "renamed"},
        {"type": NodeType.MEM_LOAD},
    ]
    if kind == NodeType.COMP:
        choices += [{"attrs": {"tensor_size": ("uint64_val", 0)}},
                    {"attrs": {"num_ops": ("double_val", 1.0)}},
                    {"attrs": {"num_ops": ("int64_val", -0.0)}}]
    else:
        choices += [{"attrs": {"comm_size": ("uint64_val", 4096)}},
                    {"attrs": {"comm_size": ("int64_val", rng.choice([0, 1, True, 99]))}}]
    if kind == NodeType.COMM_COLL:
        choices += [{"attrs": {"pg_name": ("string_val", rng.choice(list(groups)
                                                                     + ["77"]))}},
                    {"attrs": {"pg_name": ("int64_val", 1)}},
                    {"attrs": {"comm_type": ("int64_val", rng.choice([0, 1, 2, 7, 9]))}},
                    {"id": 11 - nid}]  # swap the order of two collectives
    if kind in (NodeType.COMM_SEND, NodeType.COMM_RECV):
        peer = "comm_dst" if kind == NodeType.COMM_SEND else "comm_src"
        choices += [{"attrs": {peer: ("int32_val", rng.choice([rank, world,
                                                                 (rank + 4) % world,
                                                                 rank ^ 1]))}},
                    {"attrs": {"comm_tag": ("int64_val", 10)}}]
    return replaced(ranks, rank, n, **copy.deepcopy(rng.choice(choices)))


def class_ranks_shared(ranks) -> list[TraceNode]:
    """The node objects rank 0 or rank 4 shares with the next rank of its class."""
    return [n for r in (0, 4) for n in ranks[r] if any(n is m for m in ranks[r + 1])]


def test_reuse_reports_exactly_what_checking_every_rank_reports(monkeypatch):
    rng = random.Random(11)
    for trial in range(300):
        ranks = class_ranks()
        for _ in range(rng.choice([1, 1, 2, 3])):
            ranks = _mutate(rng, ranks)
        if rng.random() < 0.2:  # a defect in a node object every rank of a class shares
            shared = rng.choice(class_ranks_shared(ranks))
            shared.attrs["tensor_size"] = ("uint64_val", 0)
        for limit in (1, 3, 50):
            got = validate(class_set(ranks), limit)
            assert got == reference(class_set(ranks), limit, monkeypatch), (trial, limit)


def test_tiny_bounds_change_nothing(monkeypatch):
    rng = random.Random(5)
    sets = []
    for _ in range(20):
        ranks = class_ranks()
        sets.append(_mutate(rng, ranks) if rng.random() < 0.7 else ranks)
    want = [validate(class_set(ranks)) for ranks in sets]
    monkeypatch.setattr(shapes_module.Shapes, "MAX_SHAPES", 1)
    monkeypatch.setattr(shapes_module.Shapes, "MAX_HELD", 1)
    monkeypatch.setattr(shapes_module.Shapes, "MAX_MEMO", 0)
    assert [validate(class_set(ranks)) for ranks in sets] == want


def test_counts_beyond_max_problems_include_replayed_and_rank_problems(monkeypatch):
    ranks = class_ranks()
    node(ranks, 0, 5).attrs["tensor_size"] = ("uint64_val", 0)  # shared by ranks 0-3
    for r in range(4):
        for nid in (2, 4):
            ranks = replaced(ranks, r, nid, attrs={"pg_name": ("string_val", "2")})
    for limit in range(1, 16):
        got = validate(class_set(ranks), limit)
        assert got == reference(class_set(ranks), limit, monkeypatch), limit
    assert len(validate(class_set(ranks), 1000)) == 4 * 3


# --------------------------------------------------------------------------- pipelines
#
# A pipelined set: 12 ranks, tp2 x dp2 x pp3 (rank = t + 2d + 4s), one rank class per
# stage.  Stages 1 and 2 start with a receive from the previous stage.  Groups: tp
# "1".."6" (1 + 2s + d), dp "11".."16" (11 + 2s + t), and the embedding groups
# "21".."24" = {r, r + 8} of the first and the last stage, where the embedding
# all-reduce sits at other positions (and node ids) in the two programs.

PIPE_GROUPS = {
    **{str(1 + 2 * s + d): [t + 2 * d + 4 * s for t in range(2)]
       for s in range(3) for d in range(2)},
    **{str(11 + 2 * s + t): [t + 2 * d + 4 * s for d in range(2)]
       for s in range(3) for t in range(2)},
    **{str(21 + r): [r, r + 8] for r in range(4)},
}
CROSSED_GROUPS = {**PIPE_GROUPS, **{str(31 + r): [r, r + 8] for r in range(4)}}


def pipe_ranks(crossed: bool = False) -> dict[int, list[TraceNode]]:
    """The pipelined set; ``crossed``: stages 0 and 2 also share groups "31".."34",
    issued after the embedding all-reduce on stage 0 and before it on stage 2 (a
    deadlock)."""
    shared = {s: {} for s in range(3)}

    def c(s, i, **kw):  # a compute node shared by the whole stage
        return shared[s].setdefault(i, comp(i, deps=[i - 1] if i else [],
                                            num_ops=10 * (i + 1) + s, **kw))

    ranks = {}
    for r in range(12):
        t, d, s = r % 2, r // 2 % 2, r // 4
        tp, dp, emb, emb2 = (str(1 + 2 * s + d), str(11 + 2 * s + t), str(21 + t + 2 * d),
                             str(31 + t + 2 * d))
        if s == 0:
            mine = [c(0, 0), coll(1, tp, deps=[0]), c(0, 2), send(3, r + 4, tag=1, deps=[2]),
                    c(0, 4), coll(5, tp, deps=[4]), c(0, 6), send(7, r + 4, tag=2, deps=[6]),
                    coll(8, emb, size=1 << 20, deps=[7]), coll(9, dp, CT.ALL_GATHER, deps=[8]),
                    c(0, 10)]
            if crossed:
                mine.insert(9, coll(11, emb2, size=64, deps=[8]))
        elif s == 1:
            mine = [recv(0, r - 4, tag=1), c(1, 1), coll(2, tp, deps=[1]), c(1, 3),
                    send(4, r + 4, tag=1, deps=[3]), recv(5, r - 4, tag=2, deps=[4]),
                    c(1, 6), coll(7, tp, deps=[6]), send(8, r + 4, tag=2, deps=[7]),
                    coll(9, dp, CT.ALL_GATHER, deps=[8]), c(1, 10)]
        else:
            mine = [recv(0, r - 4, tag=1), c(2, 1), coll(2, emb, size=1 << 20, deps=[1]),
                    coll(3, tp, deps=[2]), recv(4, r - 4, tag=2, deps=[3]), c(2, 5),
                    coll(6, tp, deps=[5]), c(2, 7), coll(8, dp, CT.ALL_GATHER, deps=[7]),
                    c(2, 9)]
            if crossed:  # the embedding all-reduce moves last, "3x" takes its place
                mine[2] = coll(2, emb2, size=64, deps=[1])
                mine.append(coll(10, emb, size=1 << 20, deps=[9]))
        ranks[r] = mine
    return ranks


def pipe_set(ranks, groups=PIPE_GROUPS) -> TraceSet:
    return make(ranks, groups, world_size=12)


@pytest.fixture
def order_graphs(monkeypatch):
    """Sizes of the graphs kahn_leftover is given, and the calls to issue_order."""
    calls = {"kahn": [], "issue_order": 0}
    kahn, issue = groups_module.kahn_leftover, groups_module.issue_order

    def counted_kahn(edges):
        edges = list(edges) if not isinstance(edges, dict) else edges
        calls["kahn"].append(len(edges))
        return kahn(edges)

    def counted_issue(summaries):
        calls["issue_order"] += 1
        return issue(summaries)
    monkeypatch.setattr(groups_module, "kahn_leftover", counted_kahn)
    monkeypatch.setattr(groups_module, "issue_order", counted_issue)
    return calls


def test_pipeline_set_is_checked_once_per_stage(structure_calls, order_graphs):
    assert validate(pipe_set(pipe_ranks())) == []
    assert structure_calls == [11, 11, 10]
    # the embedding groups join stage 0's and stage 2's chains of collectives: the
    # order is proved acyclic on that quotient (one edge per pair of consecutive
    # collectives of a stage), never on the graph of every group's collectives
    assert order_graphs == {"kahn": [3 + 2 + 3], "issue_order": 0}


def test_single_class_needs_no_order_graph(order_graphs):
    assert validate(class_set(class_ranks())) == []
    assert order_graphs == {"kahn": [], "issue_order": 0}


def test_deadlock_across_pipeline_stages_is_named(order_graphs, monkeypatch):
    ranks = pipe_ranks(crossed=True)
    problems = validate(pipe_set(ranks, CROSSED_GROUPS))
    assert problems == reference(pipe_set(ranks, CROSSED_GROUPS), 50, monkeypatch)
    assert [(p.rank, p.node_id) for p in problems] == [(0, 9)]
    assert problems[0].reason.startswith(
        "collectives deadlock, their order differs between ranks: rank 0 issues node 9 "
        "(collective #0 on group '11') before node 11 (collective #0 on group '31'); "
        "rank 8 issues node 2 (collective #0 on group '31') before node 3")
    assert order_graphs["issue_order"] == 2  # here and in the reference


@pytest.mark.parametrize("rank", [5, 6])
def test_damaged_node_of_a_middle_stage_is_reported_for_that_rank(rank, structure_calls):
    ranks = replaced(pipe_ranks(), rank, 3, attrs={"tensor_size": ("uint64_val", 0)})
    ranks = replaced(ranks, rank, 7, attrs={"is_cpu_op": ("bool_val", True)})
    assert validate(pipe_set(ranks)) == [
        Problem(rank, 3, "comp3", "tensor_size is 0, expected > 0"),
        Problem(rank, 7, "coll7", "is_cpu_op is true, expected false on a comm node")]
    assert len(structure_calls) == 4  # the damaged rank is checked on its own


def test_pipeline_reuse_reports_exactly_what_checking_every_rank_reports(monkeypatch):
    rng = random.Random(23)
    for trial in range(200):
        crossed = rng.random() < 0.3
        groups = CROSSED_GROUPS if crossed else PIPE_GROUPS
        ranks = pipe_ranks(crossed)
        for _ in range(rng.choice([1, 1, 2, 3])):
            ranks = _mutate(rng, ranks, groups)
        for limit in (2, 50):
            got = validate(pipe_set(ranks, groups), limit)
            assert got == reference(pipe_set(ranks, groups), limit, monkeypatch), (
                trial, limit)


# --------------------------------------------------------------------------- a subset of the ranks


def subset(ranks, present):
    kept = {r: nodes for r, nodes in ranks.items() if r in present}
    return TraceSet(4, GROUPS, lambda: iter(sorted(kept.items())), ranks=sorted(present))


def test_a_subset_is_checked_as_far_as_its_ranks_go():
    # ranks 0 and 3: rank 0's send to 2 and rank 3's recv from 1 have no partner in the
    # set, and groups "1", "2" have one member present: nothing to report
    assert validate(subset(base(), {0, 3})) == []
    # ranks 0 and 2: the pair is present, so a wrong tag is still found
    ranks = base()
    ranks[2][0] = recv(0, 0, tag=8)
    assert [p.reason for p in validate(subset(ranks, {0, 2}))] == [
        "send to rank 2 (tag 7, 2048 bytes) has no matching recv on rank 2; unmatched "
        "there: node 0 recv(src=0, tag 8, 2048 bytes), tag differs",
        "recv from rank 0 (tag 8, 2048 bytes) has no matching send on rank 0; unmatched "
        "there: node 3 send(dst=2, tag 7, 2048 bytes), tag differs"]
    # a rank of the subset without its trace is named; the others are not
    missing = TraceSet(4, GROUPS, lambda: iter([(0, base()[0])]), ranks=[0, 3])
    assert [(p.rank, p.reason) for p in validate(missing)] == [(3, "no trace for this rank")]
    # without the subset, the same two ranks are a set with two ranks missing
    whole = validate(make({r: n for r, n in base().items() if r in (0, 3)}))
    assert {(p.rank, p.reason) for p in whole} >= {(1, "no trace for this rank"),
                                                    (2, "no trace for this rank")}


# --------------------------------------------------------------------------- ranks given as a base and values


def stamped_ranks(built):
    """The base set with ranks 1 and 3 given as rank 0's and rank 2's nodes with their
    peers replaced; ``built`` records which ranks had to be built node by node."""
    from stage_core.trace import StampedNodes

    ranks = base()

    def build(rank):
        built.append(rank)
        return ranks[rank]

    out = dict(ranks)
    out[1] = StampedNodes(ranks[0], {("comm_dst", 2): 3}, lambda: build(1))
    out[3] = StampedNodes(ranks[2], {("comm_src", 0): 1}, lambda: build(3))
    return out


def test_stamped_ranks_are_checked_from_their_values():
    built = []
    assert validate(make(stamped_ranks(built))) == []
    assert built == []  # no node of ranks 1 and 3 was built


def test_a_stamped_rank_with_a_defect_is_checked_node_by_node():
    from stage_core.trace import StampedNodes

    built = []
    ranks = stamped_ranks(built)
    # rank 1 names rank 0's tp group: it is not a member
    ranks[1] = StampedNodes(base()[0], {("comm_dst", 2): 3, ("pg_name", "1"): "2"},
                            lambda: built.append(1) or [
                                coll(n.id, "2", deps=n.data_deps) if n.id == 1 else
                                (send(3, 3, deps=[2]) if n.id == 3 else n) for n in base()[0]])
    problems = validate(make(ranks))
    assert built == [1]
    assert (1, 1, "rank 1 is not a member of group '2' [2, 3]") in {
        (p.rank, p.node_id, p.reason) for p in problems}


def _applied(base_nodes, values):
    """``base_nodes`` with ``values`` replaced, as StampedNodes means them."""
    from stage_core.trace import RANK_ATTRS

    return [TraceNode(n.id, n.name, n.type, n.data_deps, n.ctrl_deps,
                      {name: (kind, values.get((name, v), v) if name in RANK_ATTRS else v)
                       for name, (kind, v) in n.attrs.items()}) for n in base_nodes]


def _two_sends(rank):
    # rank 0 and 1: a send to rank 2 and one to rank 3, alike (tag 7, 2048 bytes)
    return [comp(0), send(1, 2, deps=[0]), send(2, 3, deps=[1]), coll(3, "3", deps=[2])]


def _receives(rank):
    return [recv(0, 0), recv(1, 1, deps=[0]), coll(2, "3", deps=[1])]


@pytest.mark.parametrize("world, stamped", [
    (base, {1: (0, {("comm_dst", 2): 3}), 3: (2, {("comm_src", 0): 1})}),  # the usual: valid
    (base, {1: (0, {}), 3: (2, {})}),  # nothing replaced: sends and receives left unmatched
    (base, {1: (0, {("pg_name", "1"): "2", ("comm_dst", 2): 3})}),  # not a member of "2"
    (base, {1: (0, {("pg_name", "1"): "3", ("comm_dst", 2): 3})}),  # two groups become one
    (base, {1: (0, {("pg_name", "3"): "1", ("pg_name", "1"): "3", ("comm_dst", 2): 3})}),  # swapped
    (base, {3: (2, {("pg_name", "2"): "3", ("pg_name", "3"): "2", ("comm_src", 0): 1})}),
    (base, {1: (0, {("pg_name", "1"): "9", ("comm_dst", 2): 3})}),  # no such group
    (base, {1: (0, {("comm_dst", 2): 9})}),  # a peer outside the world
    (base, {1: (0, {("comm_dst", 2): 1})}),  # the rank itself
    (lambda: {0: _two_sends(0), 1: _two_sends(1), 2: _receives(2), 3: _receives(3)},
     {1: (0, {("comm_dst", 2): 3})}),  # two sends of one kind become one peer's
])
def test_a_stamped_rank_is_checked_as_its_nodes_are(world, stamped):
    from stage_core.trace import StampedNodes

    ranks = world()
    plain = dict(ranks)
    mixed = dict(ranks)
    for rank, (of, values) in stamped.items():
        plain[rank] = _applied(ranks[of], values)
        mixed[rank] = StampedNodes(ranks[of], values, lambda nodes=plain[rank]: nodes)
    assert validate(make(mixed)) == validate(make(plain))
