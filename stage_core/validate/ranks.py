"""One rank: its structural result (shared by its shape) and its rank part (group
membership, peers), reduced to the summary the checks across ranks need."""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from operator import attrgetter, itemgetter, methodcaller
from typing import Mapping, Sequence

from ..trace import NodeType, StampedNodes, TraceNode
from . import stamped
from .groups import check_group
from .pairs import check_peer
from .problems import Problems, Recorder
from .shapes import Shapes
from .structure import Shape


@dataclass(slots=True)
class RankSummary:
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
    # the index of the rank's program for the replay (Shapes.programs); -1 when the
    # rank has a problem that the simulator cannot run (see scan_rank)
    program: int = -1
    # when the pg_names are a column shared by ranks with some names replaced
    # (stamped.summary): (that column, {old name: new name}); lets the replay link
    # the rank's collectives by its group names alone
    stamp: tuple[Sequence[str], dict[str, str]] | None = None

    def collectives(self) -> list[tuple[int, str, int, int, str]]:
        """(node id, pg_name, comm_type, comm_size, node name) of each collective."""
        return list(zip(self.ids, self.pg_names, self.comm_types, self.comm_sizes,
                        self.names))


def check_rank_number(rank: int, world_size: int, seen: Mapping, out: Problems) -> bool:
    if not 0 <= rank < world_size:
        out.at(rank, None, "", f"rank outside the world (size {world_size})")
        return False
    if rank in seen:
        out.at(rank, None, "", "rank appears twice in the trace set")
        return False
    return True


def scan_rank(rank: int, nodes: list[TraceNode], groups: Mapping[str, frozenset[int]],
              world_size: int, shapes: Shapes, out: Problems) -> RankSummary:
    if isinstance(nodes, StampedNodes):
        summary = stamped.summary(rank, nodes, groups, world_size, shapes)
        if summary is not None:
            return summary
    shape = shapes.shape(nodes)
    summary = RankSummary((), (), (), (), (), defaultdict(list), defaultdict(list))
    mine = Recorder(out.limit)
    columns = _all_members(rank, nodes, shape, groups)
    if columns is None:
        collectives: list[tuple] = []
        for pos, node_type, numbers in shape.comm:
            if node_type == NodeType.COMM_COLL:
                mine.pos = pos
                check_group(rank, nodes[pos], numbers, groups, collectives, mine)
        collectives.sort()
        columns = tuple(zip(*collectives)) or ((),) * 5
    (summary.ids, summary.pg_names, summary.comm_types, summary.comm_sizes,
     summary.names) = columns
    for pos, _ in shape.peers:
        mine.pos = pos
        check_peer(rank, nodes[pos], world_size, summary, mine)
    mine.items.sort(key=itemgetter(0))  # stable: one node's problems keep their order
    if (shape.replayable and not mine.items and not mine.dropped
            and len(summary.ids) == len(shape.colls)
            and sum(map(len, summary.sends.values())) + sum(map(len, summary.recvs.values()))
            == len(shape.peers)):  # (every comm node summed up: all values are numbers)
        summary.program = shapes.program(shape, nodes)
    _report(rank, shape, mine, out)
    return summary


_PG_NAME = methodcaller("get", "pg_name")
_ATTRS = attrgetter("attrs")
_VALUE = itemgetter(1)


def _all_members(rank: int, nodes: list[TraceNode], shape: Shape,
                 groups: Mapping[str, frozenset[int]]) -> tuple | None:
    """The usual case of :func:`check_group`, for all collectives at once.

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


def _report(rank: int, shape: Shape, mine: Recorder, out: Problems) -> None:
    """Hand the structural and rank problems to ``out`` in the order of the checks.

    That order is: the checks before the per-node loop, then node by node its
    structural problems before its rank ones (a stable merge on the position).
    """
    if shape.problems or mine.items:
        merged = heapq.merge(shape.problems, mine.items, key=itemgetter(0))
        for _, node_id, name, reason in merged:
            out.at(rank, node_id, name, reason)
    out.dropped += shape.dropped + mine.dropped
