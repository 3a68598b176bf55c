"""Helpers for the MoE plugin's tests: exact numbers out of a symbolic graph."""

from __future__ import annotations

from collections import Counter

from stage_core import sym


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


def total(graph, what: str, values, ops=None) -> int:
    """``what`` (flops, matmul_flops, other_flops, bytes) summed over ``ops`` (default: every kernel)."""
    return evaluate_sum([getattr(op, what) for op in graph.kernels(ops)], values)


def within(value, expected, rel) -> bool:
    return abs(value - expected) <= rel * expected
