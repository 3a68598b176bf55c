"""Compile a rank-class program once, then stamp it onto each of its ranks.

Nodes whose attributes do not depend on the rank are encoded once per program
and kept as chunks (runs of consecutive such nodes joined together).  A node
with a rank-dependent attribute (a collective's ``pg_name``, a send's
``comm_dst``, a receive's ``comm_src``) becomes a template: its fixed pieces
are encoded once, with a :class:`~.attrs.Slot` where the value goes.  Stamping
a rank resolves each distinct ``(source, key)`` once, encodes each slot once,
and fills only the templates, so per-rank work is proportional to the number
of rank-dependent nodes.

The byte or text format is an *encoding* object (see :mod:`.et` and
:mod:`.jsontrace`) with ``sep`` (what joins node chunks), ``static(node,
attrs)``, ``template(node, attrs)``, ``slot(slot, value)`` and ``fill(template,
pieces)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from stage_core.trace import RankProgram, TraceJob

from .attrs import AttrOrSlot, Slot, node_attrs, resolve
from .errors import ChakraWriteError


@dataclass(slots=True)
class Stamp:
    """A compiled program: ``parts`` with ``None`` where each template goes."""

    parts: list[Any]
    templates: list[tuple[int, Any]]  # (index in parts, template)
    slots: tuple[Slot, ...]  # distinct slots, in first-use order


def split_on_slots(tokens: Sequence[Any], join) -> tuple[tuple[Any, ...], tuple[Slot, ...]]:
    """Group ``tokens`` into fixed pieces around the slots.

    Returns ``(statics, slots)`` with ``len(statics) == len(slots) + 1``: the
    encoded node is ``statics[0] + value(slots[0]) + statics[1] + ...``.
    """
    statics, slots, run = [], [], []
    for tok in tokens:
        if isinstance(tok, Slot):
            statics.append(join(run))
            slots.append(tok)
            run = []
        else:
            run.append(tok)
    statics.append(join(run))
    return tuple(statics), tuple(slots)


def compile_program(program: RankProgram, enc) -> Stamp:
    """Encode the rank-independent part of ``program`` once."""
    parts: list[Any] = []
    templates: list[tuple[int, Any]] = []
    slots: dict[Slot, None] = {}
    run: list[Any] = []
    for node in program.nodes:
        try:
            attrs: list[AttrOrSlot] = node_attrs(node)
            dynamic = [a for a in attrs if isinstance(a, Slot)]
            if not dynamic:
                run.append(enc.static(node, attrs))
                continue
            template = enc.template(node, attrs)
        except (TypeError, ValueError) as exc:
            raise ChakraWriteError(f"node {node.id} ({node.name!r}): {exc}") from exc
        if run:
            parts.append(enc.sep.join(run))
            run = []
        templates.append((len(parts), template))
        parts.append(None)
        slots.update(dict.fromkeys(dynamic))
    if run:
        parts.append(enc.sep.join(run))
    return Stamp(parts, templates, tuple(slots))


def stamp_rank(stamp: Stamp, rank: int, job: TraceJob, enc) -> list[Any]:
    """The chunks of ``rank``'s file body (joined with ``enc.sep``)."""
    values: dict[tuple[str, str], Any] = {}
    pieces: dict[Slot, Any] = {}
    for slot in stamp.slots:
        source = (slot.source, slot.key)
        if source not in values:
            values[source] = resolve(job, rank, slot.source, slot.key)
        try:
            pieces[slot] = enc.slot(slot, values[source])
        except (TypeError, ValueError) as exc:
            raise ChakraWriteError(
                f"rank {rank}: {slot.name} from {slot.source} {slot.key!r} "
                f"= {values[source]!r}: {exc}") from exc
    parts = list(stamp.parts)
    fill = enc.fill
    for pos, template in stamp.templates:
        parts[pos] = fill(template, pieces)
    return parts
