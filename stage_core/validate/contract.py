"""What ASTRA-sim needs of each node (REFERENCE.md §6), as tables the checks read."""

from __future__ import annotations

from typing import Mapping

from ..trace import CollectiveType, NodeType

__all__ = ["ATTR_KINDS", "ATTR_ROWS", "COMM_TYPES", "INTEGER_KINDS", "POSITIVE_ATTRS",
           "SIMULATED_COLLECTIVES"]

INTEGER_KINDS = frozenset({
    "int32_val", "int64_val", "uint32_val", "uint64_val", "sint32_val",
    "sint64_val", "fixed32_val", "fixed64_val", "sfixed32_val", "sfixed64_val",
})
INT64 = frozenset({"int64_val"})
BOOL = frozenset({"bool_val"})
STRING = frozenset({"string_val"})

#: The attributes each node type must carry and the AttributeProto oneof kinds
#: accepted for each.  A writer (the Chakra adapter) must emit one of these kinds.
ATTR_KINDS: Mapping[NodeType, Mapping[str, frozenset[str]]] = {
    NodeType.COMP: {
        "is_cpu_op": BOOL, "num_ops": INTEGER_KINDS, "tensor_size": INTEGER_KINDS,
    },
    NodeType.COMM_COLL: {
        "is_cpu_op": BOOL, "comm_type": INTEGER_KINDS, "comm_size": INT64,
        "pg_name": STRING,
    },
    NodeType.COMM_SEND: {
        "is_cpu_op": BOOL, "comm_dst": INTEGER_KINDS, "comm_tag": INTEGER_KINDS,
        "comm_size": INT64,
    },
    NodeType.COMM_RECV: {
        "is_cpu_op": BOOL, "comm_src": INTEGER_KINDS, "comm_tag": INTEGER_KINDS,
        "comm_size": INT64,
    },
}

#: integer attributes that must be > 0 (a zero tensor_size stalls the simulator)
POSITIVE_ATTRS = frozenset({"num_ops", "tensor_size", "comm_size"})

#: collective types ASTRA-sim simulates; it rejects the others
SIMULATED_COLLECTIVES = frozenset({
    CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER,
    CollectiveType.REDUCE_SCATTER, CollectiveType.ALL_TO_ALL,
})

# ATTR_KINDS as (name, kinds, must be > 0) rows, for the per-node loop
ATTR_ROWS = {
    ntype: tuple((name, kinds, name in POSITIVE_ATTRS) for name, kinds in spec.items())
    for ntype, spec in ATTR_KINDS.items()
}

COMM_TYPES = frozenset({NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV})
