"""Small graph walks shared by the checks: Kahn's algorithm and naming a cycle."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable


def kahn_leftover(edges: Iterable[tuple]) -> tuple[set, dict]:
    """Vertices Kahn's algorithm cannot order, and every vertex's predecessors."""
    succs: dict = defaultdict(list)
    preds: dict = defaultdict(list)
    indegree: Counter = Counter()
    for u, v in edges:
        succs[u].append(v)
        preds[v].append(u)
        indegree[v] += 1
        indegree[u] += 0
    ready = [v for v, n in indegree.items() if n == 0]
    while ready:
        for v in succs.get(ready.pop(), ()):
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    return {v for v, n in indegree.items() if n > 0}, preds


def find_cycle(stuck: set, preds) -> list:
    """A cycle in the left-over of Kahn's algorithm, walking predecessors.

    Every left-over vertex has a left-over predecessor, so the walk revisits a
    vertex; the vertices from its first visit on form the cycle (in walk order,
    that is each one waits on the next).
    """
    start = next(iter(stuck))
    seen: dict = {}
    walk = []
    vertex = start
    while vertex not in seen:
        seen[vertex] = len(walk)
        walk.append(vertex)
        vertex = next(p for p in preds(vertex) if p in stuck)
    return walk[seen[vertex]:]


def rotated(cycle: list) -> list:
    """The same cycle, starting at its smallest vertex (for stable messages)."""
    i = cycle.index(min(cycle))
    return cycle[i:] + cycle[:i]
