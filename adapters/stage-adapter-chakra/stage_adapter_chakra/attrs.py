"""The attributes each node carries, and the oneof each one is written in.

The oneof of every attribute is the one ASTRA-sim's Chakra feeders read (see the
README's table for where each was checked): ``mlcommons/chakra``'s
``src/feeder/et_feeder_node.cpp`` reads exactly these members, and ASTRA-sim's
newer ``feeder_v3`` accepts any integer member for integer attributes, so these
work with both.  A mismatched member reads as 0 in the first and a double
throws in the second.

Units: ``num_ops`` in FLOPs (2 per multiply-add); ``tensor_size`` and
``comm_size`` in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import index
from typing import Any, Sequence, Union

import numpy as np

from stage_core.api import NodeType, ProgramNode, TraceJob

#: attribute name -> AttributeProto oneof member it is written in
ATTRIBUTE_KINDS: dict[str, str] = {
    "is_cpu_op": "bool_val",
    "num_ops": "int64_val",
    "tensor_size": "uint64_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "pg_name": "string_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
}


@dataclass(frozen=True, slots=True)
class Slot:
    """An attribute whose value depends on the rank.

    ``source`` is ``"group"`` (value: ``job.group_name(rank, key)``, a pg_name) or
    ``"peer"`` (value: ``job.peer_rank(rank, key)``, a rank number).
    """

    name: str
    kind: str
    source: str
    key: str


#: a resolved attribute: (name, oneof member, value)
Attr = tuple[str, str, Any]
AttrOrSlot = Union[Attr, Slot]


def _attr(name: str, value: Any) -> Attr:
    return (name, ATTRIBUTE_KINDS[name], value)


def _slot(name: str, source: str, key: str) -> Slot:
    return Slot(name, ATTRIBUTE_KINDS[name], source, key)


def node_attrs(node: ProgramNode) -> list[AttrOrSlot]:
    """The attributes of ``node`` in the order they are written."""
    kind = node.type
    out: list[AttrOrSlot] = [_attr("is_cpu_op", False)]
    if kind == NodeType.COMP:
        out += [_attr("num_ops", node.num_ops), _attr("tensor_size", node.tensor_size)]
    elif kind == NodeType.COMM_COLL:
        if node.comm_type is None:
            raise ValueError("collective without comm_type")
        out += [_attr("comm_type", index(node.comm_type)),
                _attr("comm_size", node.comm_size)]
        if node.group is not None:  # no group: ASTRA-sim's all-ranks group
            out.append(_slot("pg_name", "group", node.group))
    elif kind in (NodeType.COMM_SEND, NodeType.COMM_RECV):
        if node.peer is None:
            raise ValueError("send/recv without peer")
        peer_attr = "comm_dst" if kind == NodeType.COMM_SEND else "comm_src"
        out += [_slot(peer_attr, "peer", node.peer), _attr("comm_tag", node.tag),
                _attr("comm_size", node.comm_size)]
    elif kind in (NodeType.MEM_LOAD, NodeType.MEM_STORE):
        out.append(_attr("tensor_size", node.tensor_size))
    return out


def resolve(job: TraceJob, source: str, key: str, ranks: Sequence[int]) -> list[Any]:
    """The value of a slot's ``(source, key)`` on each of ``ranks``: a pg_name (str)
    or a rank number (int).  Uses the job's array resolvers when it has them."""
    if source == "group":
        if job.group_ids is not None:
            return [str(v) for v in job.group_ids(key, np.asarray(ranks, dtype=np.int64)).tolist()]
        names = [job.group_name(rank, key) for rank in ranks]
        return [name if isinstance(name, str) else str(index(name)) for name in names]
    if source == "peer":
        if job.peer_ranks is not None:
            return job.peer_ranks(key, np.asarray(ranks, dtype=np.int64)).tolist()
        return [job.peer_rank(rank, key) for rank in ranks]
    raise ValueError(f"unknown slot source {source!r}")
