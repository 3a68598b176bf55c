"""Mesh, placements, propagation and lowering: parallelism as data."""

from .lower import ClassReport, Lowered, lower
from .mesh import GroupTable, Mesh, canonical_key
from .moe import expert_tensors
from .placement import FLAT, P, Partial, R, Replicate, Shard, ShardedGraph, conjugate, transition_kind
from .plan import AXES, DEFAULT_ORDER, Plan, divisors
from .propagate import Propagation, propagate

__all__ = [
    "AXES", "DEFAULT_ORDER", "FLAT", "P", "R", "ClassReport", "GroupTable", "Lowered", "Mesh", "Partial", "Plan",
    "Propagation", "Replicate", "Shard", "ShardedGraph", "canonical_key", "conjugate", "divisors", "expert_tensors", "lower",
    "propagate", "transition_kind",
]
