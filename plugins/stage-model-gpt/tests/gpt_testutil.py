"""Helpers for the GPT plugin's tests: exact numbers out of a symbolic graph."""

from __future__ import annotations

from collections import Counter

from stage_core import sym
from stage_core.autodiff import differentiate
from stage_core.ir.tensor import Role


def evaluate_sum(exprs, values) -> int:
    """Exact sum of many symbolic expressions (identical ones evaluated once)."""
    counts = Counter(exprs)
    keys = list(counts)
    return sum(n * v for n, v in zip(counts.values(), sym.Evaluator(keys)(values)))


def step_values(graph, b: int = 1, s: int | None = None) -> dict[str, int]:
    values = dict(graph.dims)
    values["b"] = b
    values["s"] = s if s is not None else graph.meta["seq_len"]
    return values


def training_flops(graph, b: int = 1, s: int | None = None, what: str = "matmul_flops", phase=None) -> int:
    """FLOPs of one micro-batch through the training graph (forward + backward + optimizer)."""
    tg = differentiate(graph)
    ops = [op for op in tg.kernels() if phase is None or op.phase == phase]
    return evaluate_sum([getattr(op, what) for op in ops], step_values(graph, b, s))


def saved_bytes_per_layer(training_graph, values) -> dict[int, int]:
    """Bytes of the activations each layer's forward ops keep for backward."""
    per_layer: dict[int, dict] = {}
    for op in training_graph.forward_ops:
        if op.layer is None:
            continue
        for t in op.saved:
            if t.role is Role.ACTIVATION:
                per_layer.setdefault(op.layer, {})[t] = None
    return {layer: evaluate_sum([t.nbytes for t in ts], values) for layer, ts in per_layer.items()}
