"""Decoded protobuf messages -> STAGE's format-neutral records."""

from __future__ import annotations

from typing import Any

from stage_core.api import TraceNode

from .schema import AttributeProto

_ONEOF = AttributeProto.DESCRIPTOR.oneofs_by_name["value"]
#: oneof members that hold a list message (their items are in ``.values``)
LIST_KINDS = frozenset(f.name for f in _ONEOF.fields if f.message_type is not None)


def attr_value(attr) -> tuple[str, Any]:
    """``(oneof member, value)`` of an AttributeProto; ``("", None)`` when unset."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return "", None
    if kind in LIST_KINDS:
        return kind, list(getattr(attr, kind).values)
    return kind, getattr(attr, kind)


def attr_map(attrs) -> dict[str, tuple[str, Any]]:
    """Name -> ``(kind, value)``; a repeated name keeps its first entry."""
    out: dict[str, tuple[str, Any]] = {}
    for attr in attrs:
        name = attr.name
        if name not in out:
            out[name] = attr_value(attr)
    return out


def trace_node(msg) -> TraceNode:
    """A Chakra ``Node`` message as a :class:`~stage_core.trace.TraceNode`."""
    return TraceNode(msg.id, msg.name, msg.type, list(msg.data_deps), list(msg.ctrl_deps),
                     attr_map(msg.attr), msg.duration_micros)


def metadata(msg) -> dict[str, Any]:
    """A ``GlobalMetadata`` message as ``{"version": ..., "attrs": {...}}``."""
    return {"version": msg.version, "attrs": attr_map(msg.attr)}
