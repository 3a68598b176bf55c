"""A rank read as another node list with some rank values replaced, checked from those.

A reader may hand out a rank's nodes as :class:`~stage_core.trace.StampedNodes`: a
node list shared with other ranks (``base``) and the rank's own values of pg_name,
comm_src and comm_dst.  The structural checks read nothing of those values, so the
rank has ``base``'s shape; its rank part needs only the values: the collectives'
pg_names are ``base``'s column with the values replaced (one pass in C), each
distinct pg_name is looked up once, and each send or receive takes its peer from
the values.  No node of the rank is built.

This covers the usual case only: ``base``'s shape without problems, every group
named one the rank is in, every peer another rank of the world.  Otherwise
:func:`summary` gives None and the rank is checked node by node as any other, so
its problems are named exactly as they would be.

What a summary holds of the rank is shared with its base's other ranks wherever it
can be: the pg_names are the base's column with the renaming applied when first
read (:class:`Renamed`), the sends and receives the base's lists under the rank's
peers.  So a rank costs a few steps per distinct group and peer, not per node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Mapping, Sequence
from weakref import WeakKeyDictionary

from ..trace import NodeType, StampedNodes
from .structure import attr_numbers

if TYPE_CHECKING:
    from .ranks import RankSummary
    from .shapes import Shapes

#: per Shapes (one validate call): id(base) -> (base, its columns); bounded
_COLUMNS: "WeakKeyDictionary[Shapes, dict[int, tuple]]" = WeakKeyDictionary()
_MAX_BASES = 64


def summary(rank: int, nodes: StampedNodes, groups: Mapping[str, frozenset[int]],
            world_size: int, shapes: Shapes) -> RankSummary | None:
    """The rank's summary when all is well with it (see the module doc), else None."""
    from .ranks import RankSummary

    columns = _columns(shapes, nodes.base)
    if columns is None:
        return None
    shape, pg_column, distinct, peers = columns
    values = nodes.values
    renamed = {old: new for (name, old), new in values.items() if name == "pg_name"}
    for old in distinct:
        members = groups.get(renamed.get(old, old))
        if members is None or rank not in members:
            return None
    sends, recvs = {}, {}
    for is_send, attr, old, keys in peers:
        peer = values.get((attr, old), old)
        if type(peer) is not int or not 0 <= peer < world_size or peer == rank:
            return None
        mine = sends if is_send else recvs
        for rest, held in keys:
            key = (peer, *rest)
            if key in mine:  # (two old peers became one: the lists join, in node order)
                mine[key] = sorted(mine[key] + held)
            else:
                mine[key] = held
    ids, comm_types, comm_sizes, names = shape.coll_columns
    pg_names = Renamed(pg_column, renamed) if renamed else pg_column
    return RankSummary(ids, pg_names, comm_types, comm_sizes, names, sends, recvs,
                       shapes.program(shape, nodes.base), (pg_column, renamed))


class Renamed(Sequence[str]):
    """A column of pg_names with some renamed (``renamed``: old -> new), made into a
    list the first time it is read."""

    __slots__ = ("column", "renamed", "_names")

    def __init__(self, column: Sequence[str], renamed: Mapping[str, str]):
        self.column = column
        self.renamed = renamed
        self._names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        if self._names is None:
            self._names = list(map(self.renamed.get, self.column, self.column))
        return self._names

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, index):
        return self.names[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __eq__(self, other: object) -> bool:
        return self.names == (other.names if isinstance(other, Renamed) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Renamed({self.names!r})"


def _columns(shapes: Shapes, base) -> tuple | None:
    """``base``'s shape, the pg_name of each of its collectives and the distinct ones,
    and its sends and receives: (is send, peer attribute, peer, [((tag, size), [(id,
    name)])]) for each distinct (kind, peer); None when the shape has problems or a
    value is odd (the usual path then reports them)."""
    known = _COLUMNS.setdefault(shapes, {})
    got = known.get(id(base))
    if got is not None and got[0] is base:
        return got[1]
    columns = None
    shape = shapes.shape(base)
    # (ranks._all_members reads the pg_names of the shape's last node list anew)
    shape.pg_names = None
    if not (shape.problems or shape.dropped or shape.coll_columns is None or not shape.ids_ascending):
        pg_column = [base[pos].attrs["pg_name"][1] for pos in shape.colls]
        peers: dict[tuple, dict] = {}  # (is send, attr, peer) -> (tag, size) -> [(id, name)]
        for pos, node_type in shape.peers:
            node = base[pos]
            is_send = node_type == NodeType.COMM_SEND
            attr = "comm_dst" if is_send else "comm_src"
            numbers = attr_numbers(node, attr, "comm_tag", "comm_size")
            if numbers is None or type(numbers[0]) is not int:
                break
            by_rest = peers.setdefault((is_send, attr, numbers[0]), {})
            by_rest.setdefault(numbers[1:], []).append((node.id, node.name))
        else:
            if all(type(pg) is str for pg in pg_column):
                columns = (shape, pg_column, tuple(dict.fromkeys(pg_column)),
                           [(*key, list(by_rest.items())) for key, by_rest in peers.items()])
    if len(known) >= _MAX_BASES:
        known.clear()
    known[id(base)] = (base, columns)
    return columns
