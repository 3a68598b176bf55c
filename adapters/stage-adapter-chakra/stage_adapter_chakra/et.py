"""The ``chakra`` backend's writer: Chakra ET v0.0.4 protobuf, ``trace.<rank>.et``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stage_core.api import ProgramNode, TraceJob

from . import wire
from .attrs import Slot
from .schema import ET_VERSION, GENERATOR, GENERATOR_ATTR
from .writer import write_job

FORMAT_ID = "chakra-et-0.0.4"
SUFFIX = "et"
HEADER = wire.frame(wire.metadata(ET_VERSION, [(GENERATOR_ATTR, "string_val", GENERATOR)]))


def _head(node: ProgramNode) -> bytes:
    return wire.node_head(node.id, node.name, int(node.type), node.ctrl_deps, node.data_deps,
                          node.duration_micros)


class EtEncoding:
    """Nodes as length-prefixed protobuf records after the metadata (see :mod:`.stamp`)."""

    header = HEADER
    footer = sep = b""
    prefix = staticmethod(wire.varint)

    def static(self, node: ProgramNode, attrs) -> bytes:
        body = _head(node) + b"".join([wire.attribute(*a) for a in attrs])
        return wire.frame(body)

    def template(self, node: ProgramNode, attrs) -> list[Any]:
        return [_head(node)] + [a if isinstance(a, Slot) else wire.attribute(*a) for a in attrs]

    def slot(self, slot: Slot, value: Any) -> bytes:
        return wire.attribute(slot.name, slot.kind, value)


def write(job: TraceJob, out_dir: Path) -> None:
    """Write ``trace.<rank>.et`` for every rank of ``job`` into ``out_dir``."""
    write_job(job, Path(out_dir), EtEncoding(), SUFFIX)
