"""Check a decoded trace set against what ASTRA-sim needs (REFERENCE.md §6).

ASTRA-sim is silent about many defects: a dependency cycle, a duplicate id, a send
without a receive or collectives that differ between the members of a group leave
ranks unfinished while the simulator still exits 0.  :func:`validate` finds them.

It walks ``trace_set.iter_ranks()`` once.  Each rank's nodes are checked on their
own (ids, dependencies, types, attributes) and reduced to a summary of its comm
nodes; only those summaries are kept for the checks across ranks (collective
sequences per group, deadlock-free order, send/recv matching).  Everything is linear
in the number of nodes, with iterative graph walks only.

Ranks of one rank class differ only in pg_name, comm_src and comm_dst, and a reader
may hand out the same (immutable) :class:`~stage_core.trace.TraceNode` object for
equal nodes.  The checks of a rank that do not read those values are therefore
computed once per distinct node list, up to those values, and their outcome (the
problems included) is reported again for every rank with that list; see "one rank"
below for when two lists count as the same.  Group membership, peers, collective
sequences, their order across groups and send/recv matching are checked for every
rank, on its own values.
"""

from __future__ import annotations

import gc
import heapq
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress, count, repeat
from operator import attrgetter, eq, is_, is_not, itemgetter, lt, methodcaller
from typing import Iterable, Iterator, Mapping, Sequence

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

    Python's cyclic garbage collector is paused meanwhile (see :func:`_paused_gc`).
    """
    with _paused_gc():
        return _validate(trace_set, max_problems)


@contextmanager
def _paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector, if it runs, for the duration.

    Reading and checking a set makes and drops millions of objects, none in
    reference cycles, while the decoded nodes shared between ranks stay alive: the
    collector would traverse all of them again and again (about a third of the time
    on a set of a million nodes or more) and free nothing.  Reference counting still
    frees everything as usual; the collector runs again afterwards.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _validate(trace_set: TraceSet, max_problems: int) -> list[Problem]:
    out = _Problems(max_problems)
    groups = _check_groups(trace_set, out)
    summaries: dict[int, _RankSummary] = {}
    shapes = _Shapes(max_problems)
    for rank, nodes in trace_set.iter_ranks():
        if _check_rank_number(rank, trace_set.world_size, summaries, out):
            summaries[rank] = _scan_rank(rank, nodes, groups, trace_set.world_size,
                                         shapes, out)
    for rank in range(trace_set.world_size):
        if rank not in summaries:
            out.at(rank, None, "", "no trace for this rank")
    _check_collectives(groups, summaries, out)
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
#
# A rank's checks fall in two parts.  The *structural* part (ids, dependencies, root,
# cycles, node types, attribute kinds, positive values, is_cpu_op, simulated
# collective types) reads everything of a node except the values of RANK_VALUES; the
# *rank* part (pg_name membership, peers, the summary) reads those values and the
# rank number.  Ranks of a rank class differ only in RANK_VALUES, so the structural
# part is computed once per distinct *shape* and its result (problems included) is
# replayed for each rank of that shape; the rank part always runs on every comm node
# of every rank.
#
# Two node lists have the same shape when they are as long and, position by
# position, hold either the very same node object (TraceNodes are immutable) or two
# comm nodes (COMM_COLL / COMM_SEND / COMM_RECV) of equal content minus the values of
# RANK_VALUES: id, name, type, dependencies and every attribute (name, kind, value),
# with the Python type of each so that, say, True and 1 are told apart.  A comm node
# with a value of another type than int, bool, str or bytes is the same only as
# itself.  Two ranks of one shape thus give the structural checks identical input.
# Memory stays bounded (see _Shapes); forgetting a shape only costs time.

#: attributes whose values differ between the ranks of a rank class; only the rank
#: part of the checks reads them
RANK_VALUES = frozenset({"pg_name", "comm_src", "comm_dst"})

_COMM_TYPES = frozenset({NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV})


@dataclass(slots=True)
class _RankSummary:
    """What the cross-rank checks need of one rank: its comm nodes, nothing else.

    The collectives are sorted by node id (then pg_name, type, size, name) and kept
    as columns, which ranks of one shape share except for ``pg_names``.
    """

    ids: Sequence[int]
    pg_names: Sequence[str]
    comm_types: Sequence[int]
    comm_sizes: Sequence[int]
    names: Sequence[str]
    # (peer, tag, size) -> [(node id, node name)] in node order
    sends: dict[tuple[int, int, int], list[tuple[int, str]]]
    recvs: dict[tuple[int, int, int], list[tuple[int, str]]]

    def collectives(self) -> list[tuple[int, str, int, int, str]]:
        """(node id, pg_name, comm_type, comm_size, node name) of each collective."""
        return list(zip(self.ids, self.pg_names, self.comm_types, self.comm_sizes,
                        self.names))


class _Recorder:
    """Problems of one rank as ``(position, node id, node name, reason)``.

    Same interface as :class:`_Problems` (the rank argument is ignored); ``pos`` is
    the position of the node being checked, -1 for the checks that come before the
    per-node loop.  Keeps ``limit`` problems and counts the rest: a rank's problems
    past the first ``limit`` can never make it into the report.
    """

    __slots__ = ("limit", "items", "dropped", "pos")

    def __init__(self, limit: int):
        self.limit = limit
        self.items: list[tuple[int, int | None, str, str]] = []
        self.dropped = 0
        self.pos = -1

    def add(self, rank: int | None, node: TraceNode | None, reason: str) -> None:
        if node is None:
            self.at(rank, None, "", reason)
        else:
            self.at(rank, node.id, node.name, reason)

    def at(self, rank: int | None, node_id: int | None, name: str, reason: str) -> None:
        if len(self.items) >= self.limit:
            self.dropped += 1
        else:
            self.items.append((self.pos, node_id, name, reason))


@dataclass(slots=True)
class _Shape:
    """The structural result for every rank whose nodes are the same, up to
    RANK_VALUES, as ``nodes`` (see :class:`_Shapes`)."""

    # the node list of the last rank found to have this shape
    nodes: list[TraceNode] | tuple[TraceNode, ...]
    problems: list[tuple[int, int | None, str, str]]  # as _Recorder.items
    dropped: int  # structural problems beyond the recorder's limit
    # (position, node type, (comm_type, comm_size) or None) of each comm node, in order
    comm: list[tuple[int, int, tuple | None]]
    # positions of the collectives; and, when all their comm_type and comm_size are
    # numbers, their (ids, comm_types, comm_sizes, names) for the summary
    colls: tuple[int, ...]
    coll_columns: tuple[tuple, ...] | None
    ids_ascending: bool  # the collectives' ids strictly increase with their position
    # (position, node type) of the sends and receives
    peers: list[tuple[int, int]]
    # position -> _comm_content of the node at that position of ``nodes`` (and of
    # every node list of this shape), for the positions compared so far
    contents: dict[int, tuple] = field(default_factory=dict)
    # the positions where ``nodes`` hold other objects than the node list of this
    # shape before them; None when unknown (``nodes`` are the first)
    changed: list[int] | None = None
    # the pg_name of each collective of ``nodes`` (see _all_members), None if unread
    pg_names: list | None = None
    coll_index: dict[int, int] | None = None  # position -> index in ``colls``


class _Shapes:
    """Structural results by shape, for one :func:`validate` call.

    A rank has the shape of the node list ``nodes`` of a cached :class:`_Shape`
    when its node list has the same length and, at every position, either the very
    same node object (TraceNodes are immutable), or two comm nodes of equal
    :func:`_comm_content`.  The object comparison runs in C; only the nodes that
    are other objects are compared in Python, and the content of the cached side is
    kept per position.  The rank's list then becomes the shape's ``nodes`` (the next
    rank of the class is likeliest to share its objects).

    Bounded: at most MAX_SHAPES shapes holding MAX_HELD nodes together (the newest
    is always kept), and the contents of MAX_MEMO node objects.  Forgetting costs
    only speed.
    """

    MAX_SHAPES = 16
    MAX_HELD = 1 << 18
    MAX_MEMO = 1 << 16

    def __init__(self, limit: int):
        self.limit = limit
        self.shapes: list[_Shape] = []  # most recently used first
        self.memo: dict[int, tuple] = {}  # see _same_shape

    def shape(self, nodes: list[TraceNode]) -> _Shape:
        if len(self.memo) > self.MAX_MEMO:
            self.memo.clear()
        shapes = self.shapes
        for k, found in enumerate(shapes):
            if len(found.nodes) != len(nodes):
                continue
            changed = _same_shape(found, nodes, self.memo)
            if changed is not None:
                found.nodes = tuple(nodes)  # (a reader may reuse its lists)
                found.changed = changed
                if k:
                    shapes.insert(0, shapes.pop(k))
                return found
        found = _structure(tuple(nodes), self.limit)
        shapes.insert(0, found)
        held = 0
        for k, kept in enumerate(shapes):
            held += len(kept.nodes)
            if k and (k >= self.MAX_SHAPES or held > self.MAX_HELD):
                del shapes[k:]
                break
        return found


def _same_shape(shape: _Shape, nodes: list[TraceNode], memo: dict) -> list[int] | None:
    """The positions where ``nodes`` (as long as ``shape.nodes``) hold other objects
    than ``shape.nodes`` if ``nodes`` have ``shape`` (see _Shapes), else None.

    ``memo``: id(node) -> (node, its content or None), the node kept so that its id
    is not reused while the entry exists.
    """
    known = shape.nodes
    changed = list(compress(count(), map(is_not, nodes, known)))
    if not changed:
        return changed
    contents = shape.contents
    theirs = list(map(contents.get, changed))
    if None in theirs:
        for k in compress(count(), map(is_, theirs, repeat(None))):
            pos = changed[k]
            content = _content_or_none(known[pos])
            if content is None:
                return None  # (another node of any other type: another shape)
            theirs[k] = contents[pos] = content
    mine = list(map(nodes.__getitem__, changed))
    # an entry keeps its node alive, so the id of a live node that has one is its own
    got = list(map(memo.get, map(id, mine)))
    for k in compress(count(), map(is_, got, repeat(None))):
        node = mine[k]
        got[k] = memo[id(node)] = (node, _content_or_none(node))
    return changed if all(map(eq, map(_VALUE, got), theirs)) else None


def _content_or_none(node: TraceNode) -> tuple | None:
    """:func:`_comm_content` of a comm node; None for any other node, or when the
    node stands for itself only."""
    try:
        if node.type not in _COMM_TYPES:
            return None
        return _comm_content(node)
    except (TypeError, ValueError, AttributeError, IndexError, KeyError):
        return None


def _comm_content(node: TraceNode) -> tuple:
    """Everything the structural checks can read of a comm node (see above).

    Each value comes with its type, so that True differs from 1 (equal, but checked
    differently).  Values other than int, bool, str and bytes raise TypeError (a
    float -0.0 equals 0.0 but prints otherwise; a list is mutable): such a node
    then stands for itself.
    """
    attrs = []
    for name, got in node.attrs.items():
        kind = type(got[1])
        if kind not in _PLAIN:
            raise TypeError(f"{kind.__name__} attribute")
        attrs.append((name, got[0], kind, _MASKED if name in RANK_VALUES else got[1]))
    nid, data, ctrl = node.id, tuple(node.data_deps), tuple(node.ctrl_deps)
    types = (type(nid), type(node.name), type(node.type), *map(type, data), *map(type, ctrl))
    if float in types:
        raise TypeError("float id")
    return nid, node.name, node.type, data, ctrl, tuple(attrs), types


_PLAIN = frozenset({int, bool, str, bytes})
_MASKED = object()  # stands for a value of RANK_VALUES in a node's content
_VALUE = itemgetter(1)


def _scan_rank(rank: int, nodes: list[TraceNode], groups: Mapping[str, frozenset[int]],
               world_size: int, shapes: _Shapes, out: _Problems) -> _RankSummary:
    shape = shapes.shape(nodes)
    summary = _RankSummary((), (), (), (), (), defaultdict(list), defaultdict(list))
    mine = _Recorder(out.limit)
    columns = _all_members(rank, nodes, shape, groups)
    if columns is None:
        collectives: list[tuple] = []
        for pos, node_type, numbers in shape.comm:
            if node_type == NodeType.COMM_COLL:
                mine.pos = pos
                _check_group(rank, nodes[pos], numbers, groups, collectives, mine)
        collectives.sort()
        columns = tuple(zip(*collectives)) or ((),) * 5
    (summary.ids, summary.pg_names, summary.comm_types, summary.comm_sizes,
     summary.names) = columns
    for pos, _ in shape.peers:
        mine.pos = pos
        _check_peer(rank, nodes[pos], world_size, summary, mine)
    mine.items.sort(key=itemgetter(0))  # stable: one node's problems keep their order
    _report(rank, shape, mine, out)
    return summary


_PG_NAME = methodcaller("get", "pg_name")
_ATTRS = attrgetter("attrs")


def _all_members(rank: int, nodes: list[TraceNode], shape: _Shape,
                 groups: Mapping[str, frozenset[int]]) -> tuple | None:
    """The usual case of :func:`_check_group`, for all collectives at once.

    When every collective's pg_name is a string naming a group the rank is in, and
    every comm_type and comm_size is a number, no collective has a problem and the
    result is the summary's collective columns (sorted).  Otherwise None.

    The pg_names are read from the nodes at the positions ``shape.changed`` only
    when those of the previous node list of the shape are known: every other
    position holds the very node object they were read from.
    """
    if not shape.colls:
        return ((),) * 5
    if shape.coll_columns is None:
        return None
    previous, changed = shape.pg_names, shape.changed
    shape.pg_names = None
    try:
        if previous is None or changed is None:
            pg_names = list(map(_VALUE, map(_PG_NAME, map(_ATTRS, map(nodes.__getitem__,
                                                                       shape.colls)))))
        else:
            pg_names = previous.copy()
            index = shape.coll_index
            if index is None:
                index = shape.coll_index = {pos: k for k, pos in enumerate(shape.colls)}
            for pos in changed:
                k = index.get(pos)
                if k is not None:
                    pg_names[k] = nodes[pos].attrs.get("pg_name")[1]
        distinct = set(pg_names)
    except (TypeError, IndexError, KeyError):  # pg_name missing or an odd value
        return None
    shape.pg_names = pg_names
    for pg_name in distinct:
        members = groups.get(pg_name) if isinstance(pg_name, str) else None
        if members is None or rank not in members:
            return None
    ids, comm_types, comm_sizes, names = shape.coll_columns
    if shape.ids_ascending:  # sorted already
        return ids, pg_names, comm_types, comm_sizes, names
    return tuple(zip(*sorted(zip(ids, pg_names, comm_types, comm_sizes, names))))


def _report(rank: int, shape: _Shape, mine: _Recorder, out: _Problems) -> None:
    """Hand the structural and rank problems to ``out`` in the order of the checks.

    That order is: the checks before the per-node loop, then node by node its
    structural problems before its rank ones (a stable merge on the position).
    """
    if shape.problems or mine.items:
        merged = heapq.merge(shape.problems, mine.items, key=itemgetter(0))
        for _, node_id, name, reason in merged:
            out.at(rank, node_id, name, reason)
    out.dropped += shape.dropped + mine.dropped


def _structure(nodes: tuple[TraceNode, ...], limit: int) -> _Shape:
    """The structural checks of one rank's nodes (the rank number plays no part)."""
    found = _Recorder(limit)
    if not nodes:
        found.at(None, None, "", "the trace has no nodes")
    by_id = _index_ids(None, nodes, found)
    _check_dependencies(None, nodes, by_id, found)
    comm = []
    for pos, node in enumerate(nodes):
        found.pos = pos
        if _check_node(node, found):
            if node.type == NodeType.COMM_COLL:
                comm.append((pos, NodeType.COMM_COLL, _check_collective_type(node, found)))
            else:
                comm.append((pos, node.type, None))
    colls = [(pos, numbers) for pos, node_type, numbers in comm
             if node_type == NodeType.COMM_COLL]
    columns = None
    if all(numbers is not None for _, numbers in colls):
        columns = (tuple(nodes[pos].id for pos, _ in colls),
                   tuple(numbers[0] for _, numbers in colls),
                   tuple(numbers[1] for _, numbers in colls),
                   tuple(nodes[pos].name for pos, _ in colls))
    ascending = False
    if columns is not None:
        try:
            ascending = all(map(lt, columns[0], columns[0][1:]))
        except TypeError:
            pass
    peers = [(pos, node_type) for pos, node_type, _ in comm
             if node_type != NodeType.COMM_COLL]
    return _Shape(nodes, found.items, found.dropped, comm, tuple(pos for pos, _ in colls),
                  columns, ascending, peers)


def _index_ids(rank: int | None, nodes: Sequence[TraceNode],
               out: _Recorder) -> dict[int, TraceNode]:
    by_id: dict[int, TraceNode] = {}
    for node in nodes:
        first = by_id.setdefault(node.id, node)
        if first is not node:
            out.add(rank, node, f"duplicate node id {node.id} (also {first.name!r})")
    return by_id


def _check_dependencies(rank: int | None, nodes: Sequence[TraceNode],
                        by_id: Mapping[int, TraceNode], out: _Recorder) -> None:
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


def _check_acyclic(rank: int | None, by_id: Mapping[int, TraceNode], out: _Recorder) -> None:
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


def _check_node(node: TraceNode, out: _Recorder) -> bool:
    """The structural checks of one node; whether it is a comm node for the rank part."""
    spec = _ATTR_ROWS.get(node.type)
    if spec is None:
        out.add(None, node, f"node type {_type_name(node.type)} is not one of COMP, "
                "COMM_COLL, COMM_SEND, COMM_RECV")
        return False
    _check_attr_kinds(None, node, spec, out)
    if node.type == NodeType.COMP:
        return False
    if node.attrs.get("is_cpu_op", ("", False)) == ("bool_val", True):
        out.add(None, node, "is_cpu_op is true, expected false on a comm node")
    return True


def _check_attr_kinds(rank: int | None, node: TraceNode, spec: tuple, out: _Recorder) -> None:
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


def _check_collective_type(node: TraceNode, out: _Recorder) -> tuple | None:
    """A collective's (comm_type, comm_size) if both are numbers; checks the type."""
    numbers = _numbers(node, "comm_type", "comm_size")
    if numbers is not None and numbers[0] not in SIMULATED_COLLECTIVES:
        out.add(None, node, f"comm_type {_coll_name(numbers[0])} is not simulated by "
                "ASTRA-sim; use ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER or ALL_TO_ALL")
    return numbers


def _check_group(rank: int, node: TraceNode, numbers: tuple | None,
                 groups: Mapping[str, frozenset[int]], collectives: list,
                 out: _Recorder) -> None:
    """The rank part of a collective: its pg_name names a group the rank is in."""
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
        collectives.append((node.id, pg_name, *numbers, node.name))


def _check_peer(rank: int, node: TraceNode, world_size: int, summary: _RankSummary,
                out: _Recorder) -> None:
    """The rank part of a send or receive: its peer is another rank of the world."""
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


def _check_collectives(groups: Mapping[str, frozenset[int]],
                       summaries: Mapping[int, _RankSummary], out: _Problems) -> None:
    """Collective sequences per group, then a deadlock-free order across groups.

    A first pass finds out whether anything is wrong, at the cost of a few passes in
    C over each rank's collectives: each member's (type, size) sequence on a group
    is numbered (equal sequences, equal numbers), and the order graph is proved
    acyclic through a small quotient of it (see below).  Only a group whose members'
    numbers differ, or an order graph that may have a cycle, is then examined in
    full by :func:`_check_sequences` / :func:`_check_collective_order`, which name
    the defects exactly as a full examination of every group would.
    """
    numbered: dict[tuple, int] = {((), ()): 0}  # (types, sizes) -> its number
    per_group: dict[str, dict[int, int]] = {}  # pg_name -> rank -> sequence number
    chains: dict[tuple, int] = {}  # a rank's collective ids -> its chain number
    # pg_name -> (chain, positions of its collectives) of its member with the most
    labels: dict[str, tuple[int, list[int]]] = {}
    slots = _Slots()
    for rank, summary in summaries.items():
        chain = chains.setdefault(tuple(summary.ids), len(chains))
        for pg, where in _positions_by_group(summary.pg_names).items():
            seq = (tuple(map(summary.comm_types.__getitem__, where)),
                   tuple(map(summary.comm_sizes.__getitem__, where)))
            per_group.setdefault(pg, {})[rank] = numbered.setdefault(seq, len(numbered))
            known = labels.setdefault(pg, (chain, where))
            if known[0] != chain or known[1] != where:
                slots.join(known, (chain, where))
                if len(where) > len(known[1]):
                    labels[pg] = (chain, where)
    for pg, by_rank in per_group.items():
        members = [m for m in sorted(groups[pg]) if m in summaries]
        if len({by_rank.get(m, 0) for m in members}) > 1:
            _check_sequences(pg, members, summaries, out)
    # The order graph G has a vertex (pg_name, k) for the k-th collective on a group
    # and an edge from each collective of a rank to its next one.  Ranks with the
    # same collective ids share a chain of slots (chain, 0), (chain, 1), ... with an
    # edge from each slot to the next; the k-th collective on a group sits, on each
    # member, in the slot of its position, and the slots of all members of (pg, k)
    # are joined into one vertex of a quotient graph Q.  Mapping each vertex of G to
    # its joined slots maps every edge of G to an edge of Q, so a cycle of G would
    # give one of Q: when Q has none, G has none.  Usually no slots are joined (the
    # members of every group run one program) and Q is a set of paths; otherwise Q
    # is about as small as the programs, and Kahn's algorithm decides.  If Q may have
    # a cycle, G is examined in full, and a cycle named by _check_collective_order.
    if not slots.joined:
        return
    edges: set[tuple] = set()
    for ids, chain in chains.items():
        vertices = [slots.find((chain, pos)) for pos in range(len(ids))]
        edges.update(zip(vertices, vertices[1:]))
    if not _kahn_leftover(edges)[0]:
        return
    number: dict[str, int] = {}  # pg_name -> number of its collective #0
    edges = set()
    for summary in summaries.values():
        seen: Counter = Counter()
        vertices = []
        for pg in summary.pg_names:
            vertices.append(number.setdefault(pg, len(number) << 32) + seen[pg])
            seen[pg] += 1
        edges.update(zip(vertices, vertices[1:]))
    if _kahn_leftover(edges)[0]:
        _check_collective_order(_issue_order(summaries), out)


class _Slots:
    """Union-find over the slots (chain, position) of :func:`_check_collectives`."""

    def __init__(self) -> None:
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        self.joined: set[tuple] = set()  # the (chain, positions) pairs joined so far

    def join(self, a: tuple[int, list[int]], b: tuple[int, list[int]]) -> None:
        """Join the slots of the k-th positions of ``a`` and ``b``, for each k."""
        key = (a[0], tuple(a[1]), b[0], tuple(b[1]))
        if key in self.joined:
            return
        self.joined.add(key)
        for pos_a, pos_b in zip(a[1], b[1]):
            root_a, root_b = self.find((a[0], pos_a)), self.find((b[0], pos_b))
            if root_a != root_b:
                self.parent[root_a] = root_b

    def find(self, slot: tuple[int, int]) -> tuple[int, int]:
        parent = self.parent
        while True:
            up = parent.get(slot)
            if up is None:
                return slot
            top = parent.get(up)
            if top is None:
                return up
            parent[slot] = slot = top  # path halving


def _positions_by_group(pg_names: Sequence[str]) -> dict[str, list[int]]:
    """pg_name -> the positions where it occurs, for each distinct one in order."""
    distinct = dict.fromkeys(pg_names)
    if len(distinct) <= 8:  # the usual few groups: a pass in C for each
        every = range(len(pg_names))
        return {pg: list(compress(every, map(eq, pg_names, repeat(pg)))) for pg in distinct}
    where: dict[str, list[int]] = {}
    for pos, pg in enumerate(pg_names):
        where.setdefault(pg, []).append(pos)
    return where


def _check_sequences(pg: str, members: Sequence[int], summaries: Mapping[int, _RankSummary],
                     out: _Problems) -> None:
    """Compare the members' (type, size) sequences on ``pg`` with the majority's."""
    by_rank = {m: [(ctype, size, nid, name)
                   for nid, p, ctype, size, name in summaries[m].collectives() if p == pg]
               for m in members}
    _compare_members(pg, members, by_rank, out)


def _issue_order(summaries: Mapping[int, _RankSummary]
                 ) -> dict[int, list[tuple[str, int, int, str]]]:
    """Each rank's collectives as (pg_name, position in group, id, name), in id order."""
    ordered: dict[int, list[tuple[str, int, int, str]]] = {}
    for rank, summary in summaries.items():
        seen: Counter = Counter()
        mine = ordered[rank] = []
        for nid, pg, _, _, name in summary.collectives():
            mine.append((pg, seen[pg], nid, name))
            seen[pg] += 1
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
