"""A graph of ops over tensors, kept in a valid execution order, viewed through networkx."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import networkx as nx

from .. import sym
from .ops import BACKWARD, FORWARD, OPTIMIZER, Op
from .tensor import Role, Tensor


@dataclass(frozen=True, eq=False)
class CacheDecl:
    """A tensor the model keeps per request between inference steps (a KV cache).

    ``tensor`` holds the values one step computes for its tokens, with the sequence
    at dim ``seq_dim``: a task that decodes appends them to a cache of ``ctx``
    entries and has the tensor's readers read the whole cache instead.  With
    ``seq_dim`` ``None`` it is a recurrent state of a fixed size (a Mamba layer's SSM
    and conv states): each step reads it and rewrites it in place, whatever the context.
    """

    name: str
    tensor: Tensor
    seq_dim: int | None


@dataclass(eq=False)
class Graph:
    """Ops in execution order, plus the tensors that enter and leave.

    ``meta`` holds facts about the model a later stage needs (``layers``, the
    numeric values of the dims in ``dims``...).  ``grads`` maps each parameter to
    its final gradient once autodiff has run; ``opt_state`` each parameter to its
    optimizer-state tensors.
    """

    name: str
    ops: list[Op] = field(default_factory=list)
    params: list[Tensor] = field(default_factory=list)
    inputs: list[Tensor] = field(default_factory=list)
    loss: Tensor | None = None
    dims: dict[str, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    grads: dict[Tensor, Tensor] = field(default_factory=dict)
    opt_state: dict[Tensor, tuple[Tensor, ...]] = field(default_factory=dict)
    caches: list[CacheDecl] = field(default_factory=list)
    feedback: dict[Tensor, Tensor] = field(default_factory=dict)
    #: the registered kernels this graph may use (``ModelSpec.kernels``), by name
    registered: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ structure
    def producers(self) -> dict[Tensor, Op]:
        out: dict[Tensor, Op] = {}
        for op in self.ops:
            for t in op.outputs:
                out[t] = op
        return out

    def consumers(self) -> dict[Tensor, list[Op]]:
        out: dict[Tensor, list[Op]] = {}
        for op in self.ops:
            for t in op.inputs:
                out.setdefault(t, []).append(op)
        return out

    def to_networkx(self) -> nx.DiGraph:
        """Op-level DAG: an edge from the producer of each tensor to each consumer."""
        g = nx.DiGraph()
        prod = self.producers()
        for i, op in enumerate(self.ops):
            g.add_node(i, op=op)
        index = {op: i for i, op in enumerate(self.ops)}
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                p = prod.get(t)
                if p is not None:
                    g.add_edge(index[p], i, tensor=t)
        return g

    def is_acyclic(self) -> bool:
        return nx.is_directed_acyclic_graph(self.to_networkx())

    def check_order(self) -> None:
        """Every tensor is produced before it is read, and produced at most once."""
        known = set(self.params) | set(self.inputs)
        for op in self.ops:
            for t in op.inputs:
                if t not in known and t.role not in (Role.OPTIMIZER_STATE,):
                    raise ValueError(f"op {op.name} reads {t.name} before any op produces it")
            for t in op.outputs:
                if t in known and t.role is not Role.OPTIMIZER_STATE:
                    raise ValueError(f"op {op.name} writes {t.name}, which already exists")
                known.add(t)

    # ------------------------------------------------------------------ selections
    def phase_ops(self, phase: str) -> list[Op]:
        return [op for op in self.ops if op.phase == phase]

    @property
    def forward_ops(self) -> list[Op]:
        return self.phase_ops(FORWARD)

    @property
    def backward_ops(self) -> list[Op]:
        return self.phase_ops(BACKWARD)

    @property
    def optimizer_ops(self) -> list[Op]:
        return self.phase_ops(OPTIMIZER)

    def kernels(self, ops: Iterable[Op] | None = None) -> list[Op]:
        return [op for op in (self.ops if ops is None else ops) if op.is_kernel]

    # ------------------------------------------------------------------ totals (symbolic)
    def total(self, what: str, ops: Iterable[Op] | None = None):
        """Sum of ``flops``, ``matmul_flops``, ``other_flops`` or ``bytes`` over ops."""
        total = sym.ONE * 0
        for op in self.kernels(ops):
            total += getattr(op, what)
        return total

    def param_count(self):
        return sum((p.numel for p in self.params), sym.ONE * 0)

    def __repr__(self) -> str:
        return f"Graph({self.name}: {len(self.ops)} ops, {len(self.params)} params)"
