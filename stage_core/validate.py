"""Check a decoded trace set against what ASTRA-sim needs (REFERENCE.md §6).

ASTRA-sim is silent about many defects: a dependency cycle, a duplicate id, a send
without a receive or collectives that differ between the members of a group leave
ranks unfinished while the simulator still exits 0.  :func:`validate` finds them.

It walks ``trace_set.iter_ranks()`` once.  Each rank's nodes are checked on their
own (ids, dependencies, types, attributes) and reduced to a summary of its comm
nodes; only those summaries are kept for the checks across ranks (collective
sequences per group, deadlock-free order, send/recv matching).  Everything is linear
in the number of nodes, with iterative graph walks only.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .errors import TraceError
from .trace import CollectiveType, NodeType, TraceNode, TraceSet

__all__ = ["ATTR_KINDS", "Problem", "check", "validate"]

# --------------------------------------------------------------------------- contract

INTEGER_KINDS = frozenset({
    "int32_val", "int64_val", "uint32_val", "uint64_val", "sint32_val",
    "sint64_val", "fixed32_val", "fixed64_val", "sfixed32_val", "sfixed64_val",
})
INT64 = frozenset({"int64_val"})
BOOL = frozenset({"bool_val"})
STRING = frozenset({"string_val"})

#: The attributes each node type must carry and the AttributeProto oneof kinds
#: accepted for each.  A writer (the Chakra adapter) must emit one of these kinds.
ATTR_KINDS: Mapping[NodeType, Mapping[str, frozenset[str]]] = {
    NodeType.COMP: {
        "is_cpu_op": BOOL, "num_ops": INTEGER_KINDS, "tensor_size": INTEGER_KINDS,
    },
    NodeType.COMM_COLL: {
        "is_cpu_op": BOOL, "comm_type": INTEGER_KINDS, "comm_size": INT64,
        "pg_name": STRING,
    },
    NodeType.COMM_SEND: {
        "is_cpu_op": BOOL, "comm_dst": INTEGER_KINDS, "comm_tag": INTEGER_KINDS,
        "comm_size": INT64,
    },
    NodeType.COMM_RECV: {
        "is_cpu_op": BOOL, "comm_src": INTEGER_KINDS, "comm_tag": INTEGER_KINDS,
        "comm_size": INT64,
    },
}

#: integer attributes that must be > 0 (a zero tensor_size stalls the simulator)
POSITIVE_ATTRS = frozenset({"num_ops", "tensor_size", "comm_size"})

#: collective types ASTRA-sim simulates; it rejects the others
SIMULATED_COLLECTIVES = frozenset({
    CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER,
    CollectiveType.REDUCE_SCATTER, CollectiveType.ALL_TO_ALL,
})

# ATTR_KINDS as (name, kinds, must be > 0) rows, for the per-node loop
_ATTR_ROWS = {
    ntype: tuple((name, kinds, name in POSITIVE_ATTRS) for name, kinds in spec.items())
    for ntype, spec in ATTR_KINDS.items()
}


# --------------------------------------------------------------------------- problems


@dataclass(frozen=True, slots=True)
class Problem:
    """One defect: where it is (rank, node) and what is wrong.

    ``rank`` is None for a defect of the whole set (such as a bad comm group);
    ``node_id`` is None for a defect of a whole rank.
    """

    rank: int | None
    node_id: int | None
    node_name: str
    reason: str

    def __str__(self) -> str:
        if self.rank is None:
            return f"trace set: {self.reason}"
        if self.node_id is None:
            return f"rank {self.rank}: {self.reason}"
        return f"rank {self.rank}, node {self.node_id} ({self.node_name}): {self.reason}"


class _Problems:
    """Collects up to ``limit`` problems and counts the ones beyond."""

    def __init__(self, limit: int):
        self.limit = limit
        self.items: list[Problem] = []
        self.dropped = 0

    def add(self, rank: int | None, node: TraceNode | None, reason: str) -> None:
        if len(self.items) >= self.limit:
            self.dropped += 1
            return
        node_id = None if node is None else node.id
        name = "" if node is None else node.name
        self.items.append(Problem(rank, node_id, name, reason))

    def at(self, rank: int | None, node_id: int | None, name: str, reason: str) -> None:
        if len(self.items) >= self.limit:
            self.dropped += 1
            return
        self.items.append(Problem(rank, node_id, name, reason))

    def result(self) -> list[Problem]:
        if not self.dropped:
            return self.items
        more = f"{self.dropped} more problems not listed (max_problems={self.limit})"
        return self.items + [Problem(None, None, "", more)]


# --------------------------------------------------------------------------- entry points


def validate(trace_set: TraceSet, max_problems: int = 50) -> list[Problem]:
    """Every defect found in ``trace_set``, at most ``max_problems`` of them.

    When more were found, a last problem (rank None) says how many were left out.
    An empty list means the set is fit for ASTRA-sim.
    """
    out = _Problems(max_problems)
    groups = _check_groups(trace_set, out)
    summaries: dict[int, _RankSummary] = {}
    for rank, nodes in trace_set.iter_ranks():
        if _check_rank_number(rank, trace_set.world_size, summaries, out):
            summaries[rank] = _scan_rank(rank, nodes, groups, trace_set.world_size, out)
    for rank in range(trace_set.world_size):
        if rank not in summaries:
            out.at(rank, None, "", "no trace for this rank")
    sequences = _check_sequences(groups, summaries, out)
    _check_collective_order(sequences, out)
    _check_point_to_point(summaries, out)
    return out.result()


def check(trace_set: TraceSet, max_problems: int = 50) -> None:
    """Raise :class:`TraceError` listing the problems of ``trace_set``, if any."""
    problems = validate(trace_set, max_problems)
    if problems:
        raise TraceError(problems)


# --------------------------------------------------------------------------- the set


def _check_groups(trace_set: TraceSet, out: _Problems) -> dict[str, frozenset[int]]:
    """Members of each group, after checking names and ranks of comm_groups."""
    groups = {}
    for name, members in trace_set.comm_groups.items():
        if not (isinstance(name, str) and name.isdecimal() and int(name) > 0):
            out.at(None, None, "", f"comm group name {name!r} is not a decimal string > 0")
        bad = [m for m in members if not 0 <= m < trace_set.world_size]
        if bad:
            out.at(None, None, "", f"comm group {name!r} names ranks {bad} outside "
                   f"0..{trace_set.world_size - 1}")
        members_set = frozenset(members)
        if len(members_set) != len(members):
            out.at(None, None, "", f"comm group {name!r} lists a rank twice: {list(members)}")
        groups[str(name)] = members_set
    return groups


def _check_rank_number(rank: int, world_size: int, seen: Mapping, out: _Problems) -> bool:
    if not 0 <= rank < world_size:
        out.at(rank, None, "", f"rank outside the world (size {world_size})")
        return False
    if rank in seen:
        out.at(rank, None, "", "rank appears twice in the trace set")
        return False
    return True


# --------------------------------------------------------------------------- one rank


@dataclass(slots=True)
class _RankSummary:
    """What the cross-rank checks need of one rank: its comm nodes, nothing else."""

    # (node id, pg_name, comm_type, comm_size, node name), sorted by node id
    collectives: list[tuple[int, str, int, int, str]]
    # (peer, tag, size) -> [(node id, node name)] in node order
    sends: dict[tuple[int, int, int], list[tuple[int, str]]]
    recvs: dict[tuple[int, int, int], list[tuple[int, str]]]


def _scan_rank(rank: int, nodes: list[TraceNode], groups: Mapping[str, frozenset[int]],
               world_size: int, out: _Problems) -> _RankSummary:
    if not nodes:
        out.at(rank, None, "", "the trace has no nodes")
    by_id = _index_ids(rank, nodes, out)
    _check_dependencies(rank, nodes, by_id, out)
    summary = _RankSummary([], defaultdict(list), defaultdict(list))
    for node in nodes:
        _check_node(rank, node, groups, world_size, summary, out)
    summary.collectives.sort()
    return summary


def _index_ids(rank: int, nodes: list[TraceNode], out: _Problems) -> dict[int, TraceNode]:
    by_id: dict[int, TraceNode] = {}
    for node in nodes:
        first = by_id.setdefault(node.id, node)
        if first is not node:
            out.add(rank, node, f"duplicate node id {node.id} (also {first.name!r})")
    return by_id


def _check_dependencies(rank: int, nodes: list[TraceNode], by_id: Mapping[int, TraceNode],
                        out: _Problems) -> None:
    """Every dependency exists, some node has none, and there is no cycle."""
    has_root = False
    forward = False  # a dependency on an id >= the node's own: a cycle is possible
    for node in nodes:
        nid = node.id
        data, ctrl = node.data_deps, node.ctrl_deps
        if not data and not ctrl:
            has_root = True
            continue
        for dep in data:
            if dep not in by_id:
                out.add(rank, node, f"data_deps names node {dep}, which does not exist")
            elif dep >= nid:
                forward = True
        for dep in ctrl:
            if dep not in by_id:
                out.add(rank, node, f"ctrl_deps names node {dep}, which does not exist")
            elif dep >= nid:
                forward = True
    if nodes and not has_root:
        out.at(rank, None, "", "no root: every node has a dependency, so none can start")
    if forward:
        _check_acyclic(rank, by_id, out)


def _deps(node: TraceNode, by_id: Mapping[int, TraceNode]) -> list[int]:
    return [d for d in (*node.data_deps, *node.ctrl_deps) if d in by_id]


def _check_acyclic(rank: int, by_id: Mapping[int, TraceNode], out: _Problems) -> None:
    """Kahn's algorithm; when nodes are left over, name one cycle among them."""
    waiting = {nid: len(_deps(node, by_id)) for nid, node in by_id.items()}
    users: dict[int, list[int]] = defaultdict(list)
    for nid, node in by_id.items():
        for dep in _deps(node, by_id):
            users[dep].append(nid)
    ready = [nid for nid, n in waiting.items() if n == 0]
    while ready:
        for user in users.get(ready.pop(), ()):
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    stuck = {nid for nid, n in waiting.items() if n > 0}
    if stuck:
        cycle = _rotated(_find_cycle(stuck, lambda nid: _deps(by_id[nid], by_id))[::-1])
        path = " -> ".join(_shortened([str(nid) for nid in cycle + cycle[:1]]))
        out.add(rank, by_id[cycle[0]], f"dependency cycle {path} (each node waits on "
                f"the one before it; {len(stuck)} nodes never run)")


def _find_cycle(stuck: set, preds) -> list:
    """A cycle in the left-over of Kahn's algorithm, walking predecessors.

    Every left-over vertex has a left-over predecessor, so the walk revisits a
    vertex; the vertices from its first visit on form the cycle (in walk order,
    that is each one waits on the next).
    """
    start = next(iter(stuck))
    seen: dict = {}
    walk = []
    vertex = start
    while vertex not in seen:
        seen[vertex] = len(walk)
        walk.append(vertex)
        vertex = next(p for p in preds(vertex) if p in stuck)
    return walk[seen[vertex]:]


def _rotated(cycle: list) -> list:
    """The same cycle, starting at its smallest vertex (for stable messages)."""
    i = cycle.index(min(cycle))
    return cycle[i:] + cycle[:i]


def _check_node(rank: int, node: TraceNode, groups: Mapping[str, frozenset[int]],
                world_size: int, summary: _RankSummary, out: _Problems) -> None:
    spec = _ATTR_ROWS.get(node.type)
    if spec is None:
        out.add(rank, node, f"node type {_type_name(node.type)} is not one of COMP, "
                "COMM_COLL, COMM_SEND, COMM_RECV")
        return
    _check_attr_kinds(rank, node, spec, out)
    if node.type == NodeType.COMP:
        return
    if node.attrs.get("is_cpu_op", ("", False)) == ("bool_val", True):
        out.add(rank, node, "is_cpu_op is true, expected false on a comm node")
    if node.type == NodeType.COMM_COLL:
        _check_collective(rank, node, groups, summary, out)
    else:
        _check_peer(rank, node, world_size, summary, out)


def _check_attr_kinds(rank: int, node: TraceNode, spec: tuple, out: _Problems) -> None:
    """Each attribute of ``spec`` present, of an allowed kind, positive if it must be."""
    attrs = node.attrs
    for name, kinds, positive in spec:
        got = attrs.get(name)
        if got is None:
            out.add(rank, node, f"{name} is missing, expected {_kinds_text(kinds)}")
        elif got[0] not in kinds:
            out.add(rank, node, f"{name} is {got[0]}, expected {_kinds_text(kinds)}")
        elif positive and not got[1] > 0:
            out.add(rank, node, f"{name} is {got[1]}, expected > 0")


def _numbers(node: TraceNode, *names: str) -> tuple | None:
    """The values of ``names`` when all are present and numeric (kinds aside).

    A wrong kind is reported by :func:`_check_attr_kinds`; the value still takes part
    in the checks across ranks so that one defect is not reported twice.
    """
    attrs = node.attrs
    values = []
    for name in names:
        got = attrs.get(name)
        if got is None:
            return None
        value = got[1]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        values.append(value)
    return tuple(values)


def _check_collective(rank: int, node: TraceNode, groups: Mapping[str, frozenset[int]],
                      summary: _RankSummary, out: _Problems) -> None:
    numbers = _numbers(node, "comm_type", "comm_size")
    if numbers is not None and numbers[0] not in SIMULATED_COLLECTIVES:
        out.add(rank, node, f"comm_type {_coll_name(numbers[0])} is not simulated by "
                "ASTRA-sim; use ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER or ALL_TO_ALL")
    pg_name = node.attr("pg_name")
    if not isinstance(pg_name, str):
        return
    members = groups.get(pg_name)
    if members is None:
        out.add(rank, node, f"pg_name {pg_name!r} is not in comm_groups "
                f"({_names_text(groups)})")
    elif rank not in members:
        out.add(rank, node, f"rank {rank} is not a member of group {pg_name!r} "
                f"{sorted(members)}")
    elif numbers is not None:
        summary.collectives.append((node.id, pg_name, *numbers, node.name))


def _check_peer(rank: int, node: TraceNode, world_size: int, summary: _RankSummary,
                out: _Problems) -> None:
    is_send = node.type == NodeType.COMM_SEND
    peer_attr = "comm_dst" if is_send else "comm_src"
    numbers = _numbers(node, peer_attr, "comm_tag", "comm_size")
    if numbers is None:
        return
    peer = numbers[0]
    if not (peer == int(peer) and 0 <= peer < world_size):
        out.add(rank, node, f"{peer_attr} {peer} is not a rank (world size {world_size})")
    elif peer == rank:
        out.add(rank, node, f"{peer_attr} {peer} is the rank itself")
    else:
        (summary.sends if is_send else summary.recvs)[numbers].append((node.id, node.name))


# --------------------------------------------------------------------------- collectives


def _check_sequences(groups: Mapping[str, frozenset[int]],
                     summaries: Mapping[int, _RankSummary],
                     out: _Problems) -> dict[int, list[tuple[str, int, int, str]]]:
    """Compare each group's members' (type, size) sequences with the majority's.

    Returns each rank's collectives as (pg_name, position in group, id, name),
    in node id order, for the ordering check.
    """
    per_group: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    ordered: dict[int, list[tuple[str, int, int, str]]] = {}
    for rank, summary in summaries.items():
        mine = ordered[rank] = []
        for nid, pg, ctype, size, name in summary.collectives:
            seq = per_group[pg][rank]
            mine.append((pg, len(seq), nid, name))
            seq.append((ctype, size, nid, name))
    for pg, by_rank in per_group.items():
        members = [m for m in sorted(groups[pg]) if m in summaries]
        _compare_members(pg, members, by_rank, out)
    return ordered


def _compare_members(pg: str, members: Sequence[int], by_rank: Mapping[int, list],
                     out: _Problems) -> None:
    keys = {m: tuple((t, s) for t, s, _, _ in by_rank.get(m, ())) for m in members}
    reference_key = Counter(keys[m] for m in members).most_common(1)[0][0]
    ref = next(m for m in members if keys[m] == reference_key)
    ref_seq = by_rank.get(ref, [])
    for member in members:
        if keys[member] != reference_key:
            _report_difference(pg, member, by_rank.get(member, []), ref, ref_seq, out)


def _report_difference(pg: str, rank: int, seq: list, ref: int, ref_seq: list,
                       out: _Problems) -> None:
    for k, (mine, theirs) in enumerate(zip(seq, ref_seq)):
        if mine[:2] != theirs[:2]:
            out.at(rank, mine[2], mine[3], f"collective #{k} on group {pg!r} is "
                   f"{_coll_text(mine)} here but {_coll_text(theirs)} on rank {ref} "
                   f"(node {theirs[2]})")
            return
    k = min(len(seq), len(ref_seq))
    if len(seq) > len(ref_seq):
        extra = seq[k]
        out.at(rank, extra[2], extra[3], f"rank issues {len(seq)} collectives on group "
               f"{pg!r} but rank {ref} issues {len(ref_seq)}; collective #{k} "
               f"({_coll_text(extra)}) has no partner")
    else:
        missing = ref_seq[k]
        out.at(rank, None, "", f"rank issues {len(seq)} collectives on group {pg!r} but "
               f"rank {ref} issues {len(ref_seq)}; missing collective #{k} "
               f"({_coll_text(missing)}, node {missing[2]} on rank {ref})")


def _check_collective_order(ordered: Mapping[int, list[tuple[str, int, int, str]]],
                            out: _Problems) -> None:
    """Collective instances ordered by each rank's issue order must form a DAG.

    A vertex is (pg_name, k), the k-th collective on that group; each rank adds an
    edge from each of its collectives to its next one (in node id order).  A cycle
    means every rank on it waits for a collective that another rank on it has not
    issued yet: a deadlock.
    """
    witness: dict[tuple, tuple[int, int, str, int, str]] = {}
    for rank, colls in ordered.items():
        for (pg_a, k_a, id_a, name_a), (pg_b, k_b, id_b, name_b) in zip(colls, colls[1:]):
            witness.setdefault(((pg_a, k_a), (pg_b, k_b)), (rank, id_a, name_a, id_b, name_b))
    stuck, preds = _kahn_leftover(witness)
    if not stuck:
        return
    # reversed, each vertex is issued before the next one on some rank
    cycle = _rotated(_find_cycle(stuck, lambda v: preds[v])[::-1])
    steps = []
    for u, v in zip(cycle, cycle[1:] + cycle[:1]):
        rank, id_u, _, id_v, _ = witness[(u, v)]
        steps.append(f"rank {rank} issues node {id_u} ({_instance(u)}) before node "
                     f"{id_v} ({_instance(v)})")
    rank, id_u, name_u, _, _ = witness[(cycle[0], cycle[1 % len(cycle)])]
    out.at(rank, id_u, name_u, "collectives deadlock, their order differs between "
           "ranks: " + "; ".join(_shortened(steps)))


def _kahn_leftover(edges: Iterable[tuple]) -> tuple[set, dict]:
    """Vertices Kahn's algorithm cannot order, and every vertex's predecessors."""
    succs: dict = defaultdict(list)
    preds: dict = defaultdict(list)
    indegree: Counter = Counter()
    for u, v in edges:
        succs[u].append(v)
        preds[v].append(u)
        indegree[v] += 1
        indegree[u] += 0
    ready = [v for v, n in indegree.items() if n == 0]
    while ready:
        for v in succs.get(ready.pop(), ()):
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    return {v for v, n in indegree.items() if n > 0}, preds


# --------------------------------------------------------------------------- send / recv


def _check_point_to_point(summaries: Mapping[int, _RankSummary], out: _Problems) -> None:
    """Multiset matching: send(r -> d, tag, size) pairs with recv on d from r."""
    unmatched_sends = _unmatched(summaries, "sends", "recvs")
    unmatched_recvs = _unmatched(summaries, "recvs", "sends")
    near_recv = _by_pair(unmatched_recvs)
    near_send = _by_pair(unmatched_sends)
    for rank, (peer, tag, size), nid, name in unmatched_sends:
        hint = _nearest(near_recv.get((peer, rank)), tag, size, "recv", f"src={rank}")
        out.at(rank, nid, name, f"send to rank {peer} (tag {tag}, {size} bytes) has no "
               f"matching recv on rank {peer}{hint}")
    for rank, (peer, tag, size), nid, name in unmatched_recvs:
        hint = _nearest(near_send.get((peer, rank)), tag, size, "send", f"dst={rank}")
        out.at(rank, nid, name, f"recv from rank {peer} (tag {tag}, {size} bytes) has no "
               f"matching send on rank {peer}{hint}")


def _unmatched(summaries: Mapping[int, _RankSummary], mine: str, theirs: str) -> list:
    """(rank, (peer, tag, size), node id, name) of ``mine`` left without a partner."""
    left = []
    for rank, summary in summaries.items():
        for (peer, tag, size), nodes in getattr(summary, mine).items():
            other = summaries.get(peer)
            partners = getattr(other, theirs).get((rank, tag, size), ()) if other else ()
            for nid, name in nodes[len(partners):]:
                left.append((rank, (peer, tag, size), nid, name))
    return left


def _by_pair(unmatched: list) -> dict[tuple[int, int], list]:
    """Unmatched nodes indexed by (their rank, their peer)."""
    pairs: dict[tuple[int, int], list] = defaultdict(list)
    for rank, (peer, tag, size), nid, _ in unmatched:
        pairs[(rank, peer)].append((nid, tag, size))
    return pairs


def _nearest(candidates: list | None, tag: int, size: int, kind: str, peer: str) -> str:
    """Describe the unmatched partner-side node that looks meant for this one."""
    if not candidates:
        return ""
    nid, their_tag, their_size = min(
        candidates, key=lambda c: (c[1] != tag) + (c[2] != size))
    differs = [what for what, same in (("tag", their_tag == tag), ("size", their_size == size))
               if not same]
    return (f"; unmatched there: node {nid} {kind}({peer}, tag {their_tag}, "
            f"{their_size} bytes), {' and '.join(differs)} differ"
            + ("s" if len(differs) == 1 else ""))


# --------------------------------------------------------------------------- wording


def _shortened(items: list[str], keep: int = 6) -> list[str]:
    """At most ``2 * keep + 1`` items: the first and last ``keep`` and a count between."""
    if len(items) <= 2 * keep + 1:
        return items
    return items[:keep] + [f"... {len(items) - 2 * keep} more ..."] + items[-keep:]


def _kinds_text(kinds: frozenset[str]) -> str:
    if kinds is INTEGER_KINDS:
        return "an integer kind (int64_val, uint64_val, int32_val, ...)"
    return " or ".join(sorted(kinds))


def _type_name(value: int) -> str:
    try:
        return f"{NodeType(value).name} ({value})"
    except ValueError:
        return str(value)


def _coll_name(value: int) -> str:
    try:
        return f"{CollectiveType(value).name} ({value})"
    except ValueError:
        return str(value)


def _coll_text(entry: tuple) -> str:
    comm_type, size = entry[0], entry[1]
    try:
        name = CollectiveType(comm_type).name
    except ValueError:
        name = f"comm_type {comm_type}"
    return f"{name} of {size} bytes"


def _instance(vertex: tuple[str, int]) -> str:
    return f"collective #{vertex[1]} on group {vertex[0]!r}"


def _names_text(groups: Mapping[str, frozenset[int]], shown: int = 8) -> str:
    names = sorted(groups, key=lambda n: (len(n), n))
    if not names:
        return "no groups defined"
    text = ", ".join(repr(n) for n in names[:shown])
    more = f", ... {len(names) - shown} more" if len(names) > shown else ""
    return f"known: {text}{more}"
