"""Decoded protobuf messages -> STAGE's format-neutral records."""

from __future__ import annotations

from typing import Any

from stage_core.trace import TraceNode


def attr_value(attr) -> tuple[str, Any]:
    """``(oneof member, value)`` of an AttributeProto; ``("", None)`` when unset."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return "", None
    value = getattr(attr, kind)
    if kind.endswith("_list"):
        value = list(value.values)
    return kind, value


def attr_map(attrs) -> dict[str, tuple[str, Any]]:
    """Name -> ``(kind, value)``; a repeated name keeps its first entry."""
    out: dict[str, tuple[str, Any]] = {}
    for attr in attrs:
        if attr.name not in out:
            out[attr.name] = attr_value(attr)
    return out


def trace_node(msg) -> TraceNode:
    """A Chakra ``Node`` message as a :class:`~stage_core.trace.TraceNode`."""
    return TraceNode(
        id=msg.id,
        name=msg.name,
        type=msg.type,
        data_deps=list(msg.data_deps),
        ctrl_deps=list(msg.ctrl_deps),
        attrs=attr_map(msg.attr),
    )


def metadata(msg) -> dict[str, Any]:
    """A ``GlobalMetadata`` message as ``{"version": ..., "attrs": {...}}``."""
    return {"version": msg.version, "attrs": attr_map(msg.attr)}
