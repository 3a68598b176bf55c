"""Structural results reused across the ranks of one shape.

A rank's checks fall in two parts.  The *structural* part (ids, dependencies, root,
cycles, node types, attribute kinds, positive values, is_cpu_op, simulated
collective types) reads everything of a node except the values of RANK_VALUES; the
*rank* part (pg_name membership, peers, the summary) reads those values and the
rank number.  Ranks of a rank class differ only in RANK_VALUES, so the structural
part is computed once per distinct *shape* and its result (problems included) is
replayed for each rank of that shape; the rank part always runs on every comm node
of every rank.

Two node lists have the same shape when they are as long and, position by
position, hold either the very same node object (TraceNodes are immutable) or two
comm nodes (COMM_COLL / COMM_SEND / COMM_RECV) of equal content minus the values of
RANK_VALUES: id, name, type, dependencies and every attribute (name, kind, value),
with the Python type of each so that, say, True and 1 are told apart.  A comm node
with a value of another type than int, bool, str or bytes is the same only as
itself.  Two ranks of one shape thus give the structural checks identical input.
Memory stays bounded (see Shapes); forgetting a shape only costs time.
"""

from __future__ import annotations

from itertools import compress, count, repeat
from operator import eq, is_, is_not, itemgetter

from ..trace import TraceNode
from .contract import COMM_TYPES
from .replay import Program, build_program
from .structure import Shape, check_structure

#: attributes whose values differ between the ranks of a rank class; only the rank
#: part of the checks reads them
RANK_VALUES = frozenset({"pg_name", "comm_src", "comm_dst"})


class Shapes:
    """Structural results by shape, for one :func:`validate` call.

    A rank has the shape of the node list ``nodes`` of a cached :class:`Shape`
    when its node list has the same length and, at every position, either the very
    same node object (TraceNodes are immutable), or two comm nodes of equal
    :func:`_comm_content`.  The object comparison runs in C; only the nodes that
    are other objects are compared in Python, and the content of the cached side is
    kept per position.  The rank's list then becomes the shape's ``nodes`` (the next
    rank of the class is likeliest to share its objects).

    Bounded: at most MAX_SHAPES shapes holding MAX_HELD nodes together (the newest
    is always kept), and the contents of MAX_MEMO node objects.  Forgetting costs
    only speed.

    The replay's :class:`~.replay.Program` of each shape is kept for the whole call,
    once per distinct program (a forgotten shape that comes back finds its program).
    """

    MAX_SHAPES = 16
    MAX_HELD = 1 << 18
    MAX_MEMO = 1 << 16

    def __init__(self, limit: int):
        self.limit = limit
        self.shapes: list[Shape] = []  # most recently used first
        self.memo: dict[int, tuple] = {}  # see _same_shape
        self.programs: list[Program] = []
        self._program_index: dict[tuple, int] = {}  # Program.key -> index

    def shape(self, nodes: list[TraceNode]) -> Shape:
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
        found = check_structure(tuple(nodes), self.limit)
        shapes.insert(0, found)
        held = 0
        for k, kept in enumerate(shapes):
            held += len(kept.nodes)
            if k and (k >= self.MAX_SHAPES or held > self.MAX_HELD):
                del shapes[k:]
                break
        return found

    def program(self, shape: Shape, nodes: list[TraceNode]) -> int:
        """The index in :attr:`programs` of the program of ``nodes``, of ``shape``
        (which must be replayable)."""
        if shape.program is None:
            shape.program = next((k for k, known in enumerate(self.programs)
                                  if known.built_from(nodes)), None)
        if shape.program is None:
            program = build_program(nodes)
            shape.program = self._program_index.setdefault(program.key, len(self.programs))
            if shape.program == len(self.programs):
                self.programs.append(program)
        return shape.program


def _same_shape(shape: Shape, nodes: list[TraceNode], memo: dict) -> list[int] | None:
    """The positions where ``nodes`` (as long as ``shape.nodes``) hold other objects
    than ``shape.nodes`` if ``nodes`` have ``shape`` (see Shapes), else None.

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
        if node.type not in COMM_TYPES:
            return None
        return _comm_content(node)
    except (TypeError, ValueError, AttributeError, IndexError, KeyError):
        return None


def _comm_content(node: TraceNode) -> tuple:
    """Everything the structural checks can read of a comm node (see the module docstring).

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
