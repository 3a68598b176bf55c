"""Compute nodes timed on a GPU: each one's ``duration_micros``.

Chakra stores a node's duration in whole microseconds, and ASTRA-sim replays
exactly that (``Workload::issue_replay``: duration x 1000 ns, a 0 taken as 1 ns).
Rounding each kernel on its own would lose or invent up to half a microsecond per
kernel, and a layer has dozens of short ones.  So the rounding error is carried
along the rank's compute order: node i gets ``round(T_i) - round(T_{i-1})`` where
``T_i`` is the exact time of the first i kernels, and every prefix of the program
(a layer, a micro-batch, the step) is within half a microsecond of its exact sum.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from .kernel import Kernel, kernel
from .records import ComputeModelSpec, HardwareSpec
from .trace import NodeType, ProgramNode, RankProgram


def node_kernel(node: ProgramNode) -> Kernel:
    """The node's kernel; for a compute node made without one, what its counts say."""
    if node.kernel is not None:
        return node.kernel
    matmul = node.num_ops if node.flops_kind == "matmul" else 0
    return kernel("unknown", "", "", "", {}, "bf16", flops=node.num_ops, matmul_flops=matmul,
                  nbytes=node.tensor_size)


class KernelTimer:
    """Seconds per kernel under one compute model on one GPU, each distinct kernel timed once."""

    def __init__(self, model: ComputeModelSpec, hw: HardwareSpec):
        self.model, self.hw = model, hw
        self._seconds: dict[Kernel, float] = {}

    def __call__(self, k: Kernel) -> float:
        got = self._seconds.get(k)
        if got is None:
            got = self._seconds[k] = float(self.model.time(k, self.hw.gpu))
        return got


def time_program(program: RankProgram, seconds: Callable[[Kernel], float]) -> tuple[RankProgram, int]:
    """``program`` with every compute node's ``duration_micros``, and their sum."""
    exact = 0.0  # microseconds
    written = 0
    nodes: list[ProgramNode] = []
    for node in program.nodes:
        if node.type == NodeType.COMP:
            exact += seconds(node_kernel(node)) * 1e6
            micros = round(exact) - written
            written += micros
            node = dataclasses.replace(node, duration_micros=micros)
        nodes.append(node)
    return dataclasses.replace(program, nodes=tuple(nodes)), written


def time_programs(programs: Sequence[RankProgram],
                  seconds: Callable[[Kernel], float]) -> tuple[list[RankProgram], list[int]]:
    """:func:`time_program` over every rank class: (timed programs, compute microseconds per class)."""
    timed = [time_program(p, seconds) for p in programs]
    return [p for p, _ in timed], [t for _, t in timed]
