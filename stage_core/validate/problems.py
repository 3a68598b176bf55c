"""Problems: what a check reports, how many are kept, and how they are worded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..trace import CollectiveType, NodeType, TraceNode
from .contract import INTEGER_KINDS


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


class Problems:
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

    @property
    def total(self) -> int:
        """Problems found so far, kept or not."""
        return len(self.items) + self.dropped

    def result(self) -> list[Problem]:
        if not self.dropped:
            return self.items
        more = f"{self.dropped} more problems not listed (max_problems={self.limit})"
        return self.items + [Problem(None, None, "", more)]


class Recorder:
    """Problems of one rank as ``(position, node id, node name, reason)``.

    Same interface as :class:`Problems` (the rank argument is ignored); ``pos`` is
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


# --------------------------------------------------------------------------- wording


def shortened(items: list[str], keep: int = 6) -> list[str]:
    """At most ``2 * keep + 1`` items: the first and last ``keep`` and a count between."""
    if len(items) <= 2 * keep + 1:
        return items
    return items[:keep] + [f"... {len(items) - 2 * keep} more ..."] + items[-keep:]


def kinds_text(kinds: frozenset[str]) -> str:
    if kinds is INTEGER_KINDS:
        return "an integer kind (int64_val, uint64_val, int32_val, ...)"
    return " or ".join(sorted(kinds))


def type_name(value: int) -> str:
    try:
        return f"{NodeType(value).name} ({value})"
    except ValueError:
        return str(value)


def coll_name(value: int) -> str:
    try:
        return f"{CollectiveType(value).name} ({value})"
    except ValueError:
        return str(value)


def coll_text(entry: tuple) -> str:
    comm_type, size = entry[0], entry[1]
    try:
        name = CollectiveType(comm_type).name
    except ValueError:
        name = f"comm_type {comm_type}"
    return f"{name} of {size} bytes"


def instance_text(vertex: tuple[str, int]) -> str:
    return f"collective #{vertex[1]} on group {vertex[0]!r}"


def names_text(groups: Mapping[str, frozenset[int]], shown: int = 8) -> str:
    names = sorted(groups, key=lambda n: (len(n), n))
    if not names:
        return "no groups defined"
    text = ", ".join(repr(n) for n in names[:shown])
    more = f", ... {len(names) - shown} more" if len(names) > shown else ""
    return f"known: {text}{more}"
