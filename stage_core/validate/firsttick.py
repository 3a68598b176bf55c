"""The simulator's first tick: the one way ASTRA-sim fails a set whatever its order.

A node that finishes in 0 ns at time 0 trips an assertion of the analytical network's
event queue and the run aborts (:data:`stage_core.hardware.TICK_ZERO`).  On a
roofline run (a set without durations) the node a rank issues at time 0 is its first
kernel (:func:`stage_core.hardware.first_kernel`), and it lasts
``roofline_ns(num_ops, tensor_size, peak, bandwidth)`` whole nanoseconds: 0 for a
kernel of under about 3 KB on an H100.  A timed set runs with the roofline off and
every duration at least 1 ns, so it never aborts there.

The replay decides order; this decides the first tick, on the rooflines of the GPUs
the caller names (``stage validate``: every registered preset, as ``stage generate``
warns), so validate says what the simulator will do on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..hardware import first_kernel, roofline_ns
from ..trace import StampedNodes, TraceNode

#: a GPU's roofline as ASTRA-sim's system.json gives it: (peak-perf TFLOPS, local-mem-bw GB/s)
Roofline = tuple[float, float]


@dataclass(frozen=True, slots=True)
class FirstTick:
    """Ranks whose first kernel takes 0 ns on some rooflines: the simulator aborts there."""

    ranks: tuple[int, ...]
    node_id: int
    name: str
    num_ops: int
    tensor_size: int
    gpus: tuple[str, ...]  # the rooflines (GPU names) on which it takes 0 ns


class FirstKernels:
    """Each rank's first kernel, found once per node list that ranks share (a reader's
    StampedNodes differ only in group names and peers, which the first kernel ignores)."""

    def __init__(self) -> None:
        self.of: dict[int, TraceNode | None] = {}
        self._memo: tuple[object, TraceNode | None] | None = None

    def add(self, rank: int, nodes: Sequence[TraceNode]) -> None:
        base = nodes.base if isinstance(nodes, StampedNodes) else nodes
        if self._memo is not None and self._memo[0] is base:
            self.of[rank] = self._memo[1]
            return
        node = first_kernel(base)
        self._memo = (base, node)
        self.of[rank] = node


def _value(node: TraceNode, name: str) -> int:
    value = node.attr(name, 0)
    return value if type(value) is int else 0


def first_tick(firsts: Mapping[int, TraceNode | None], rooflines: Mapping[str, Roofline],
               timed: bool) -> FirstTick | None:
    """The ranks whose first kernel takes 0 ns on one of ``rooflines`` (None: none, or a
    ``timed`` set, whose kernels run for their durations)."""
    if timed or not rooflines:
        return None
    hit: dict[int, tuple[str, ...]] = {}
    example: TraceNode | None = None
    for rank, node in sorted(firsts.items()):
        if node is None or node.duration_micros:
            continue
        ops, size = _value(node, "num_ops"), _value(node, "tensor_size")
        gpus = tuple(name for name, (peak, bandwidth) in sorted(rooflines.items())
                     if roofline_ns(ops, size, peak, bandwidth) == 0)
        if gpus:
            hit[rank] = gpus
            example = example or node
    if example is None:
        return None
    gpus = tuple(sorted({g for found in hit.values() for g in found}))
    return FirstTick(tuple(hit), example.id, example.name, _value(example, "num_ops"),
                     _value(example, "tensor_size"), gpus)
