"""The ``chakra-json`` backend's writer: the same content as JSON, ``trace.<rank>.json``.

Each file is one JSON document::

    {"metadata": <GlobalMetadata>,
    "nodes": [
    <Node>,
    ...
    ]}

where each message is in protobuf's JSON mapping (what ``json_format.MessageToDict``
gives: lowerCamelCase names, 64-bit integers as decimal strings, enums by name,
default values left out) with keys in field-number order, so the same job always
gives the same text.
"""

from __future__ import annotations

import json
from operator import index
from pathlib import Path
from typing import Any

from stage_core.api import ProgramNode, TraceJob

from . import schema, wire
from .attrs import Slot
from .writer import write_job

FORMAT_ID = "chakra-json-0.0.4"
SUFFIX = "json"
HEADER = '{"metadata": {"version": %s, "attr": [{"name": %s, "stringVal": %s}]},\n"nodes": [\n' % (
    json.dumps(schema.ET_VERSION), json.dumps(schema.GENERATOR_ATTR), json.dumps(schema.GENERATOR))
FOOTER = "\n]}\n"

_ATTR_JSON = {f.name: f.json_name for f in schema.AttributeProto.DESCRIPTOR.fields}
_NODE_JSON = {f.name: f.json_name for f in schema.Node.DESCRIPTOR.fields}
_QUOTED = {"int64_val", "uint64_val"}  # 64-bit integers are JSON strings


def _str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def attr_json(name: str, kind: str, value: Any) -> str:
    """One AttributeProto in protobuf's JSON mapping."""
    wire.check(kind, value)  # same type and range checks as the binary writer
    if kind == "bool_val":
        text = "true" if value else "false"
    elif kind == "string_val":
        text = _str(value)
    elif kind in _QUOTED:
        text = '"%d"' % index(value)
    else:
        text = "%d" % index(value)
    name_part = '"name": %s, ' % _str(name) if name else ""
    return '{%s"%s": %s}' % (name_part, _ATTR_JSON[kind], text)


def _deps(values) -> str:
    return "[%s]" % ", ".join('"%d"' % wire.check("uint64_val", v) for v in values)


def node_fields(node: ProgramNode) -> list[str]:
    """The node's ``"key": value`` texts before its attributes."""
    fields = []
    if node.id:
        fields.append('"id": "%d"' % index(node.id))
    if node.name:
        fields.append('"name": %s' % _str(node.name))
    if node.type:
        fields.append('"type": "%s"' % schema.NODE_TYPE_NAMES[int(node.type)])
    if node.ctrl_deps:
        fields.append('"%s": %s' % (_NODE_JSON["ctrl_deps"], _deps(node.ctrl_deps)))
    if node.data_deps:
        fields.append('"%s": %s' % (_NODE_JSON["data_deps"], _deps(node.data_deps)))
    if node.duration_micros:
        fields.append('"%s": "%d"' % (_NODE_JSON["duration_micros"], index(node.duration_micros)))
    return fields


class JsonEncoding:
    """Nodes as JSON text, one per line, UTF-8 (see :mod:`.stamp`)."""

    header = HEADER.encode()
    footer = FOOTER.encode()
    sep = b",\n"

    def _tokens(self, node: ProgramNode, attrs) -> list[Any]:
        tokens: list[Any] = ["{" + ", ".join(node_fields(node) + ['"attr": ['])]
        for i, a in enumerate(attrs):
            if i:
                tokens.append(", ")
            tokens.append(a if isinstance(a, Slot) else attr_json(*a))
        tokens.append("]}")
        return tokens

    def static(self, node: ProgramNode, attrs) -> bytes:
        if not attrs:
            return ("{" + ", ".join(node_fields(node)) + "}").encode()
        return "".join(self._tokens(node, attrs)).encode()

    def template(self, node: ProgramNode, attrs) -> list[Any]:
        return [t if isinstance(t, Slot) else t.encode() for t in self._tokens(node, attrs)]

    @staticmethod
    def prefix(size: int) -> bytes:
        return b""

    def slot(self, slot: Slot, value: Any) -> bytes:
        return attr_json(slot.name, slot.kind, value).encode()


def write(job: TraceJob, out_dir: Path) -> None:
    """Write ``trace.<rank>.json`` for every rank of ``job`` into ``out_dir``."""
    write_job(job, Path(out_dir), JsonEncoding(), SUFFIX)
