"""The ``chakra`` backend's writer: Chakra ET v0.0.4 protobuf, ``trace.<rank>.et``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stage_core.trace import ProgramNode, TraceJob

from . import wire
from .attrs import Slot
from .schema import ET_VERSION
from .stamp import split_on_slots
from .writer import write_job

FORMAT_ID = "chakra-et-0.0.4"
SUFFIX = "et"
HEADER = wire.frame(wire.metadata(ET_VERSION))


def _head(node: ProgramNode) -> bytes:
    return wire.node_head(node.id, node.name, int(node.type), node.ctrl_deps, node.data_deps)


class EtEncoding:
    """Nodes as length-prefixed protobuf records (see :mod:`.stamp`)."""

    sep = b""

    def static(self, node: ProgramNode, attrs) -> bytes:
        body = _head(node) + b"".join([wire.attribute(*a) for a in attrs])
        return wire.frame(body)

    def template(self, node: ProgramNode, attrs) -> tuple[Any, ...]:
        tokens = [_head(node)] + [a if isinstance(a, Slot) else wire.attribute(*a)
                                  for a in attrs]
        statics, slots = split_on_slots(tokens, b"".join)
        return statics, slots, sum(map(len, statics))

    def slot(self, slot: Slot, value: Any) -> bytes:
        return wire.attribute(slot.name, slot.kind, value)

    def fill(self, template, pieces) -> bytes:
        statics, slots, size = template
        if len(slots) == 1:
            piece = pieces[slots[0]]
            return b"".join((wire.varint(size + len(piece)), statics[0], piece, statics[1]))
        out = [statics[0]]
        for slot, static in zip(slots, statics[1:]):
            out += (pieces[slot], static)
        body = b"".join(out)
        return wire.varint(len(body)) + body

    def write_file(self, path: Path, parts: list[bytes]) -> None:
        with open(path, "wb") as f:
            f.write(HEADER)
            f.writelines(parts)


def write(job: TraceJob, out_dir: Path) -> None:
    """Write ``trace.<rank>.et`` for every rank of ``job`` into ``out_dir``."""
    write_job(job, Path(out_dir), EtEncoding(), SUFFIX)
