"""The structural checks of one rank's node list: ids, dependencies, cycles, node
types and attributes.  They read everything of a node except the values that differ
between the ranks of a rank class (see :mod:`.shapes`), and give a :class:`Shape`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from operator import lt
from typing import Mapping, Sequence

from ..trace import NodeType, TraceNode
from .contract import ATTR_ROWS, SIMULATED_COLLECTIVES
from .graphs import find_cycle, rotated
from .problems import Recorder, coll_name, kinds_text, shortened, type_name


@dataclass(slots=True)
class Shape:
    """The structural result for every rank whose nodes are the same, up to
    RANK_VALUES, as ``nodes`` (see :class:`Shapes`)."""

    # the node list of the last rank found to have this shape
    nodes: list[TraceNode] | tuple[TraceNode, ...]
    problems: list[tuple[int, int | None, str, str]]  # as Recorder.items
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
    # position -> shapes._comm_content of the node at that position of ``nodes`` (and of
    # every node list of this shape), for the positions compared so far
    contents: dict[int, tuple] = field(default_factory=dict)
    # the positions where ``nodes`` hold other objects than the node list of this
    # shape before them; None when unknown (``nodes`` are the first)
    changed: list[int] | None = None
    # the pg_name of each collective of ``nodes`` (see ranks._all_members), None if unread
    pg_names: list | None = None
    coll_index: dict[int, int] | None = None  # position -> index in ``colls``
    # the replay can run these nodes: no structural problem but a dependency cycle
    replayable: bool = False
    program: int | None = None  # index of the replay's program (see Shapes.program)


def check_structure(nodes: tuple[TraceNode, ...], limit: int) -> Shape:
    """The structural checks of one rank's nodes (the rank number plays no part)."""
    found = Recorder(limit)
    if not nodes:
        found.at(None, None, "", "the trace has no nodes")
    by_id = _index_ids(None, nodes, found)
    cyclic = _check_dependencies(None, nodes, by_id, found)
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
    replayable = len(found.items) + found.dropped == cyclic
    return Shape(nodes, found.items, found.dropped, comm, tuple(pos for pos, _ in colls),
                 columns, ascending, peers, replayable=replayable)


def _index_ids(rank: int | None, nodes: Sequence[TraceNode],
               out: Recorder) -> dict[int, TraceNode]:
    by_id: dict[int, TraceNode] = {}
    for node in nodes:
        first = by_id.setdefault(node.id, node)
        if first is not node:
            out.add(rank, node, f"duplicate node id {node.id} (also {first.name!r})")
    if len(by_id) < len(nodes):  # the very same node object twice: a reader shares equal records
        seen: set[int] = set()
        for node in nodes:
            if node.id in seen and by_id[node.id] is node:
                out.add(rank, node, f"duplicate node id {node.id} (also {node.name!r}, the same record twice)")
            seen.add(node.id)
    return by_id


def _check_dependencies(rank: int | None, nodes: Sequence[TraceNode],
                        by_id: Mapping[int, TraceNode], out: Recorder) -> bool:
    """Every dependency exists, some node has none, and there is no cycle; whether
    a cycle was reported."""
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
    return forward and _check_acyclic(rank, by_id, out)


def _deps(node: TraceNode, by_id: Mapping[int, TraceNode]) -> list[int]:
    return [d for d in (*node.data_deps, *node.ctrl_deps) if d in by_id]


def _check_acyclic(rank: int | None, by_id: Mapping[int, TraceNode], out: Recorder) -> bool:
    """Kahn's algorithm; when nodes are left over, name one cycle among them (and
    say so)."""
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
        cycle = rotated(find_cycle(stuck, lambda nid: _deps(by_id[nid], by_id))[::-1])
        path = " -> ".join(shortened([str(nid) for nid in cycle + cycle[:1]]))
        out.add(rank, by_id[cycle[0]], f"dependency cycle {path} (each node waits on "
                f"the one before it; {len(stuck)} nodes never run)")
    return bool(stuck)


def _check_node(node: TraceNode, out: Recorder) -> bool:
    """The structural checks of one node; whether it is a comm node for the rank part."""
    spec = ATTR_ROWS.get(node.type)
    if spec is None:
        out.add(None, node, f"node type {type_name(node.type)} is not one of COMP, "
                "COMM_COLL, COMM_SEND, COMM_RECV")
        return False
    _check_attr_kinds(None, node, spec, out)
    if node.type == NodeType.COMP:
        return False
    if node.attrs.get("is_cpu_op", ("", False)) == ("bool_val", True):
        out.add(None, node, "is_cpu_op is true, expected false on a comm node")
    return True


def _check_attr_kinds(rank: int | None, node: TraceNode, spec: tuple, out: Recorder) -> None:
    """Each attribute of ``spec`` present, of an allowed kind, positive if it must be."""
    attrs = node.attrs
    for name, kinds, positive in spec:
        got = attrs.get(name)
        if got is None:
            out.add(rank, node, f"{name} is missing, expected {kinds_text(kinds)}")
        elif got[0] not in kinds:
            out.add(rank, node, f"{name} is {got[0]}, expected {kinds_text(kinds)}")
        elif positive and not got[1] > 0:
            out.add(rank, node, f"{name} is {got[1]}, expected > 0")


def attr_numbers(node: TraceNode, *names: str) -> tuple | None:
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


def _check_collective_type(node: TraceNode, out: Recorder) -> tuple | None:
    """A collective's (comm_type, comm_size) if both are numbers; checks the type."""
    numbers = attr_numbers(node, "comm_type", "comm_size")
    if numbers is not None and numbers[0] not in SIMULATED_COLLECTIVES:
        out.add(None, node, f"comm_type {coll_name(numbers[0])} is not simulated by "
                "ASTRA-sim; use ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER or ALL_TO_ALL")
    return numbers
