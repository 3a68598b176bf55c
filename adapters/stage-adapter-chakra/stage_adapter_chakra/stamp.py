"""Compile a rank-class program once, then stamp it onto each of its ranks.

A class's whole file is serialized once, as a list of byte pieces around *slots*:
the attribute entries whose value depends on the rank (a collective's
``pg_name``, a send's ``comm_dst``, a receive's ``comm_src``).  A node without
such an attribute is encoded once and merged with its neighbours into one fixed
piece.  A node with one is a *template*: its fixed pieces are encoded once; only
its framing (a length prefix, in the protobuf encoding) depends on how long the
slot's value is.

Stamping a rank is then: encode each of the class's few distinct slot values
once (``enc.slot``), take the fixed pieces for those values' lengths (made once
per distinct combination of lengths, :meth:`Stamp.pieces`), and interleave the
two lists in one join.  No node is encoded again, and per-rank work is a few list
operations in C plus the copy of the file's bytes.

The byte format is an *encoding* object (see :mod:`.et` and :mod:`.jsontrace`):
``header``, ``footer`` and ``sep`` (what a file starts and ends with, what joins
two records), ``static(node, attrs)`` (a whole record), ``template(node, attrs)``
(a record's body as bytes pieces and :class:`~.attrs.Slot` markers),
``prefix(size)`` (the framing before a record body of ``size`` bytes) and
``slot(slot, value)`` (the bytes of one slot's entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable

from stage_core.api import RankProgram

from .attrs import Slot, node_attrs
from .errors import ChakraWriteError


@dataclass(slots=True)
class Record:
    """A template: ``statics[0] + value(slots[0]) + statics[1] + ...``, framed."""

    statics: tuple[bytes, ...]
    slots: tuple[int, ...]  # index of each slot in Stamp.slots
    size: int  # bytes of the statics together


@dataclass(slots=True)
class Stamp:
    """A compiled program: fixed pieces, templates, and the distinct slots they use."""

    runs: list[bytes | Record]  # the file body in order
    slots: tuple[Slot, ...]  # distinct slots, in first-use order
    prefix: Callable[[int], bytes]
    uses: Callable[[tuple], tuple] = field(init=False)  # slot values, in occurrence order
    count: int = field(init=False)  # slot occurrences in the file
    _fixed: dict[tuple[int, ...], list[bytes]] = field(default_factory=dict)

    def __post_init__(self):
        order = [k for run in self.runs if isinstance(run, Record) for k in run.slots]
        self.count = len(order)
        if not order:
            self.uses = lambda values: ()
        elif len(order) == 1:
            self.uses = lambda values, k=order[0]: (values[k],)
        else:
            self.uses = itemgetter(*order)

    def pieces(self, lengths: tuple[int, ...]) -> list[bytes]:
        """The fixed pieces around the slot occurrences when slot ``k``'s value takes
        ``lengths[k]`` bytes: ``count + 1`` of them."""
        fixed = self._fixed.get(lengths)
        if fixed is None:
            fixed, run = [], []
            for item in self.runs:
                if not isinstance(item, Record):
                    run.append(item)
                    continue
                run += (self.prefix(item.size + sum(lengths[k] for k in item.slots)), item.statics[0])
                for static in item.statics[1:]:
                    fixed.append(b"".join(run))
                    run = [static]
            fixed.append(b"".join(run))
            if len(self._fixed) < 256:  # (a few length combinations in practice)
                self._fixed[lengths] = fixed
        return fixed

    def file(self, values: tuple[bytes, ...]) -> bytes:
        """The file of a rank whose slot ``k`` encodes to ``values[k]``."""
        fixed = self.pieces(tuple(map(len, values)))
        if not self.count:
            return fixed[0]
        out: list[Any] = [None] * (2 * self.count + 1)
        out[0::2] = fixed
        out[1::2] = self.uses(values)
        return b"".join(out)


def compile_program(program: RankProgram, enc) -> Stamp:
    """Encode the rank-independent part of ``program``'s file once."""
    runs: list[bytes | Record] = [enc.header]
    slots: dict[Slot, int] = {}
    for i, node in enumerate(program.nodes):
        if i:
            runs.append(enc.sep)
        try:
            attrs = node_attrs(node)
            if not any(isinstance(a, Slot) for a in attrs):
                runs.append(enc.static(node, attrs))
                continue
            tokens = enc.template(node, attrs)
        except (TypeError, ValueError) as exc:
            raise ChakraWriteError(f"node {node.id} ({node.name!r}): {exc}") from exc
        statics, used, run = [], [], []
        for tok in tokens:
            if isinstance(tok, Slot):
                statics.append(b"".join(run))
                used.append(slots.setdefault(tok, len(slots)))
                run = []
            else:
                run.append(tok)
        statics.append(b"".join(run))
        runs.append(Record(tuple(statics), tuple(used), sum(map(len, statics))))
    runs.append(enc.footer)
    return Stamp(merge_runs(runs), tuple(slots), enc.prefix)


def merge_runs(runs: list[bytes | Record]) -> list[bytes | Record]:
    """``runs`` with each stretch of fixed pieces between two templates joined."""
    merged: list[bytes | Record] = []
    pending: list[bytes] = []
    for run in runs:
        if isinstance(run, Record):
            if pending:
                merged.append(b"".join(pending))
                pending = []
            merged.append(run)
        elif run:
            pending.append(run)
    if pending:
        merged.append(b"".join(pending))
    return merged
