"""Format-neutral trace records.

Two layers meet here:

* :class:`ProgramNode` / :class:`RankProgram` / :class:`TraceJob` are what lowering
  hands to a trace backend.  A program is shared by every rank of a *rank class*;
  the only rank-dependent facts are which process group a collective runs on
  (``group``, an axis key such as ``"tp"`` or ``"dp"``) and which rank a send or
  receive talks to (``peer``, a key such as ``"pp+1"``).  The job resolves both per
  rank, so a backend stamps a program onto a rank instead of rebuilding it.

* :class:`TraceNode` is what a backend's reader gives back: one decoded node with
  its attributes and their wire types, for the validator and for tests.

The numeric enums mirror Chakra ET v0.0.4 (``et_def.proto``) because that is the
format every consumer of these traces speaks; a backend for another format maps
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from .kernel import Kernel


class NodeType(IntEnum):
    INVALID = 0
    METADATA = 1
    MEM_LOAD = 2
    MEM_STORE = 3
    COMP = 4
    COMM_SEND = 5
    COMM_RECV = 6
    COMM_COLL = 7


class CollectiveType(IntEnum):
    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


#: manifest/report key for each collective type STAGE emits
COMM_KEYS: Mapping[CollectiveType, str] = {
    CollectiveType.ALL_REDUCE: "all_reduce",
    CollectiveType.ALL_GATHER: "all_gather",
    CollectiveType.REDUCE_SCATTER: "reduce_scatter",
    CollectiveType.ALL_TO_ALL: "all_to_all",
}


# --------------------------------------------------------------------------- programs


@dataclass(frozen=True, slots=True)
class ProgramNode:
    """One node of a rank-class program, with concrete numbers.

    Units: ``num_ops`` in FLOPs (2 per multiply-add), ``tensor_size`` and
    ``comm_size`` in bytes.  ``comm_size`` follows ASTRA-sim's meaning: the full
    buffer per rank for all-reduce and all-to-all, the full input per rank for
    reduce-scatter, the per-rank input shard for all-gather.

    A compute node carries its ``kernel`` (what a compute model times; one object
    shared by every copy of the op) and, once timed on a GPU, ``duration_micros``:
    whole microseconds, as Chakra stores them (0: not timed).
    """

    id: int
    name: str
    type: NodeType
    data_deps: tuple[int, ...] = ()
    ctrl_deps: tuple[int, ...] = ()
    num_ops: int = 0
    tensor_size: int = 0
    comm_type: CollectiveType | None = None
    comm_size: int = 0
    group: str | None = None  # axis key, resolved per rank to a pg_name
    peer: str | None = None  # peer key, resolved per rank to a rank number
    tag: int = 0
    flops_kind: str = "other"  # "matmul" or "other", for reports only
    kernel: "Kernel | None" = None
    duration_micros: int = 0


@dataclass(frozen=True, slots=True)
class RankProgram:
    """The program every rank in ``ranks`` runs (a rank class)."""

    ranks: tuple[int, ...]
    nodes: tuple[ProgramNode, ...]
    label: str = ""


@dataclass(slots=True)
class TraceJob:
    """Everything a backend needs to write one trace set.

    ``group_name(rank, key)`` gives the pg_name (a decimal string) of the group
    ``key`` that ``rank`` belongs to; ``peer_rank(rank, key)`` the rank a send or
    receive with peer ``key`` talks to.  ``comm_groups`` maps every pg_name any
    program can resolve to its member ranks.

    ``group_ids(key, ranks)`` and ``peer_ranks(key, ranks)``, when given, answer
    the same for a whole numpy array of ranks at once (pg_names as integers);
    a backend uses them instead of calling the scalar ones rank by rank.

    How to write the set: ``ranks`` (None: every rank) are the ranks whose files
    are written; ``workers`` the processes that write them (None: one per core);
    ``progress(n)``, when given, is told each time ``n`` more files are written.
    """

    programs: Sequence[RankProgram]
    world_size: int
    comm_groups: Mapping[str, Sequence[int]]
    group_name: Callable[[int, str], str]
    peer_rank: Callable[[int, str], int]
    manifest: Mapping[str, Any] = field(default_factory=dict)
    name: str = "stage"
    group_ids: Callable[[str, Any], Any] | None = None
    peer_ranks: Callable[[str, Any], Any] | None = None
    ranks: Sequence[int] | None = None
    workers: int | None = None
    progress: Callable[[int], None] | None = None


# --------------------------------------------------------------------------- decoded traces


@dataclass(slots=True)
class TraceNode:
    """A node as a reader decoded it.

    ``attrs`` maps attribute name to ``(kind, value)`` where ``kind`` is the name of
    the protobuf oneof field that carried it (``"int64_val"``, ``"uint64_val"``,
    ``"bool_val"``, ``"string_val"``, ``"double_val"``, ...), so a checker can tell
    an int64 from a uint64 or a double.

    Treat a TraceNode as immutable once a reader has returned it: neither it nor its
    lists and ``attrs`` dict may be changed.  A reader may hand out one object for
    every occurrence of an equal node (the ``chakra`` reader shares a node among all
    the files, and ranks, whose record has the same bytes), and the validator relies
    on this: it checks a node list that holds the very same objects as one it has
    checked before without re-reading them.  To change a node, build a new one.
    """

    id: int
    name: str
    type: int
    data_deps: list[int] = field(default_factory=list)
    ctrl_deps: list[int] = field(default_factory=list)
    attrs: dict[str, tuple[str, Any]] = field(default_factory=dict)
    duration_micros: int = 0

    def attr(self, name: str, default: Any = None) -> Any:
        got = self.attrs.get(name)
        return default if got is None else got[1]


@dataclass(slots=True)
class TraceSet:
    """A decoded trace set: its groups and a way to iterate ranks lazily.

    ``ranks``: the ranks whose traces the set holds when it is a subset of the
    world (ascending); None when it holds every rank 0..world_size-1.
    """

    world_size: int
    comm_groups: Mapping[str, Sequence[int]]
    iter_ranks: Callable[[], Iterator[tuple[int, list[TraceNode]]]]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    ranks: Sequence[int] | None = None


class StampedNodes(Sequence[TraceNode]):
    """A rank's nodes, given as a node list shared with other ranks and the rank's own
    values of the attributes that differ between the ranks of a rank class.

    Node for node, the rank's nodes are ``base``'s, except that an attribute in
    :data:`RANK_ATTRS` whose value in ``base`` is ``old`` has the value
    ``values[(name, old)]`` instead (same kind), wherever ``(name, old)`` is a key.
    A reader hands this out for a file it read as another file with those values
    replaced; a checker may work from ``base`` and ``values`` alone.  Indexing or
    iterating builds the nodes themselves (``build()``, once).
    """

    __slots__ = ("base", "values", "_build", "_nodes")

    def __init__(self, base: Sequence[TraceNode], values: Mapping[tuple[str, Any], Any],
                 build: Callable[[], list[TraceNode]]):
        self.base = base
        self.values = values
        self._build = build
        self._nodes: list[TraceNode] | None = None

    @property
    def nodes(self) -> list[TraceNode]:
        if self._nodes is None:
            self._nodes = self._build()
        return self._nodes

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index):
        return self.nodes[index]

    def __iter__(self) -> Iterator[TraceNode]:
        return iter(self.nodes)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, StampedNodes)):
            return self.nodes == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StampedNodes({len(self.base)} nodes, {len(self.values)} values replaced)"


#: the attributes whose values differ between the ranks of a rank class
RANK_ATTRS = frozenset({"pg_name", "comm_src", "comm_dst"})
