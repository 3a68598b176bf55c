"""Placements (Shard, Replicate, Partial) and the annotations strategies declare.

A tensor's layout is one placement per mesh axis (axes not named are Replicate).
``Shard(dim)`` names the sharded tensor dim by position (an int) or by dim name
(a str such as ``"s"``, resolved per tensor to the position whose size is that
dim); ``Shard(FLAT)`` shards the flattened tensor (ZeRO's model-state partitions).

Strategies never write collectives.  They fill a :class:`ShardedGraph` with
facts: how parameters are placed while computing and while stored, how inputs
are split, which placements tagged activations want, what gradients reduce to,
and what is recomputed.  Propagation derives everything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..ir.graph import Graph
from ..ir.tensor import Tensor
from ..trace import CollectiveType

FLAT = "*"


@dataclass(frozen=True)
class Shard:
    dim: int | str

    def __repr__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate:
    def __repr__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial:
    def __repr__(self) -> str:
        return "P"


R = Replicate()
P = Partial()

Layout = Mapping[str, object]  # axis -> Shard | Partial (Replicate entries omitted)


def transition_kind(src, dst) -> CollectiveType | None:
    """The collective that turns ``src`` into ``dst`` on one axis (None: local, no traffic)."""
    if src == dst:
        return None
    if isinstance(src, Partial):
        if isinstance(dst, Replicate):
            return CollectiveType.ALL_REDUCE
        if isinstance(dst, Shard):
            return CollectiveType.REDUCE_SCATTER
    if isinstance(src, Shard):
        if isinstance(dst, Replicate):
            return CollectiveType.ALL_GATHER
        if isinstance(dst, Shard):
            return CollectiveType.ALL_TO_ALL
    if isinstance(src, Replicate) and isinstance(dst, (Shard, Partial)):
        return None
    raise ValueError(f"no transition from {src} to {dst}")


def conjugate(kind: CollectiveType | None) -> CollectiveType | None:
    """The collective a transition's backward runs (all-gather <-> reduce-scatter)."""
    return {
        CollectiveType.ALL_GATHER: CollectiveType.REDUCE_SCATTER,
        CollectiveType.REDUCE_SCATTER: CollectiveType.ALL_GATHER,
        CollectiveType.ALL_TO_ALL: CollectiveType.ALL_TO_ALL,
        CollectiveType.ALL_REDUCE: None,
    }.get(kind) if kind is not None else None


def dim_position(t: Tensor, dim: int | str) -> int | None:
    """Position of ``dim`` (an index, or a dim name matched against the shape) in ``t``."""
    if isinstance(dim, int):
        return dim if -t.rank <= dim < t.rank else None
    for i, size in enumerate(t.shape):
        if getattr(size, "name", None) == dim:
            return i
    return None


def layout_key(layout: Layout) -> tuple:
    return tuple(sorted((a, repr(p)) for a, p in layout.items() if not isinstance(p, Replicate)))


@dataclass(eq=False)
class ShardedGraph:
    """A training graph plus the placements strategies declared for it."""

    graph: Graph
    degrees: dict[str, int]
    param_compute: dict[Tensor, dict[str, object]] = field(default_factory=dict)
    param_storage: dict[Tensor, dict[str, object]] = field(default_factory=dict)
    grad_target: dict[str, object] = field(default_factory=dict)  # axis -> R (all-reduce) or Shard(FLAT)
    grad_storage_sharded: set[str] = field(default_factory=set)  # axes over which grads are kept as shards
    optimizer_sharded: set[str] = field(default_factory=set)  # axes over which optimizer state is sharded
    input_layout: dict[Tensor, dict[str, object]] = field(default_factory=dict)
    tag_hints: dict[str, dict[str, object]] = field(default_factory=dict)
    recompute: str = "none"
    moe_dispatcher: str = "alltoall"  # how MoE tokens reach their experts (parallel.moe)
    pipeline: tuple[int, int] = (1, 1)  # (stages, virtual stages per rank): layers split into stages*virtual chunks
    stage_layers: tuple[int, ...] | None = None  # layers per chunk, in chunk order; None: an even split
    # an axis over which each pipeline message is split: every rank of the axis sends its slice of a
    # tensor replicated over it and the receiver all-gathers the slices (Megatron's scatter/gather)
    pipeline_split: str | None = None
    # how ZeRO-3 / FSDP gathers stored shards: "layer" (one all-gather of a layer's parameters, an FSDP
    # unit) or "parameter" (one all-gather per parameter tensor, as DeepSpeed's ZeRO-3 fetches them)
    gather_unit: str = "layer"
    # axis -> block ("" for every block) -> dim names an op's sharding on that axis prefers,
    # where its inputs are sharded on different letters (sequence vs heads: DeepSpeed-Ulysses)
    prefer: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    reuse_forward: set[str] = field(default_factory=set)  # axes on which backward reads tensors as forward moved them
    rings: set[str] = field(default_factory=set)  # axes over which a kernel that can streams its ring letter
    # parameters stored sharded (ZeRO-3) are gathered once per step, at their first use, and kept to the
    # optimizer step (FSDP without resharding after forward, as Llama 3 trains); False: gathered again
    # for every micro-batch's forward and backward
    keep_gathered: bool = False
    applied: list[str] = field(default_factory=list)

    def active(self, axis: str) -> bool:
        return self.degrees.get(axis, 1) > 1

    # ------------------------------------------------------------------ declarations
    def shard_params(self, axis: str, dims: Iterable[str], *, where=None) -> list[tuple[Tensor, int]]:
        """Shard, on ``axis``, the first dim of each parameter named in ``dims``.

        Returns the (parameter, position) pairs sharded.  ``where(param)`` may
        restrict the parameters considered.
        """
        out = []
        names = list(dims)
        for p in self.graph.params:
            if where is not None and not where(p):
                continue
            for name in names:
                pos = dim_position(p, name)
                if pos is not None:
                    self.param_compute.setdefault(p, {})[axis] = Shard(pos)
                    out.append((p, pos))
                    break
        return out

    def shard_inputs(self, axis: str, dim: str) -> None:
        for t in self.graph.inputs:
            pos = dim_position(t, dim)
            if pos is not None:
                self.input_layout.setdefault(t, {})[axis] = Shard(pos)

    def hint(self, tag: str, axis: str, placement) -> None:
        self.tag_hints.setdefault(tag, {})[axis] = placement

    def prefer_dims(self, axis: str, dims: tuple[str, ...], block: str = "") -> None:
        """On ``axis``, ops of ``block`` (every block: "") keep the first letter whose size is
        one of ``dims`` sharded, moving inputs sharded on other letters to it."""
        self.prefer.setdefault(axis, {})[block] = tuple(dims)

    def compute_layout(self, p: Tensor) -> dict[str, object]:
        return self.param_compute.get(p, {})

    def storage_layout(self, p: Tensor) -> dict[str, object]:
        return self.param_storage.get(p, self.compute_layout(p))
