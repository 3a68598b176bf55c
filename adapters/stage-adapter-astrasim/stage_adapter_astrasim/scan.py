"""One read of a trace set before it reaches the simulator: validation and the run's own checks.

The set is decoded once (through the installed backend that reads it); as the
validator walks its ranks, the checks this run needs look at the same nodes:

* the first kernel of each rank class on a roofline: 0 ns would abort the simulator
  at its first tick (:data:`stage_core.api.hardware.TICK_ZERO`);
* for htsim, every message's size against the frontend's C ``int``, and each rank's
  compute (one kernel at a time: a lower bound of its step) against the 3 s of
  simulated time after which htsim cannot run a step.

Without validation the checks read only as far as they need.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Sequence

from stage_core.api import (COMM_KEYS, NodeType, PluginHost, Progress, StageError, TraceError, UsageError, hardware,
                            netmodel, read_trace_set, validate_trace_set)

from .report import rank_ranges


class FirstKernels:
    """Refuse a set whose first kernel on some rank class takes 0 ns on this roofline."""

    def __init__(self, classes: Sequence[Mapping], peak_tflops: float, mem_gbps: float):
        self.wanted = {rc["ranks"][0]: rc["ranks"] for rc in classes if rc.get("ranks")}
        self.peak, self.mem = peak_tflops, mem_gbps
        self.problem: StageError | None = None

    @property
    def done(self) -> bool:
        return not self.wanted

    def visit(self, rank: int, nodes, groups) -> None:
        members = self.wanted.pop(rank, None)
        if members is None or self.problem is not None:
            return
        node = hardware.first_kernel(nodes)
        if node is None:
            return
        ops, size = node.attr("num_ops", 0), node.attr("tensor_size", 0)
        if hardware.roofline_ns(ops, size, self.peak, self.mem) == 0:
            self.problem = StageError(
                f"ranks {rank_ranges(members)}: the first kernel, node {node.id} ({node.name}, {ops} FLOPs, "
                f"{size} bytes), takes under 1 ns on this roofline ({self.peak} TFLOPS, {self.mem} GB/s), and "
                f"{hardware.TICK_ZERO}; generate the set with --gpu NAME (timed kernels last at least 1 ns) or a "
                "larger batch")


class NodeDetails:
    """Keeps, for the ranks a timeline shows, what each node is (:func:`.timeline.node_details`:
    FLOPs, bytes, collective type, group...), read in the same pass."""

    problem = None

    def __init__(self, ranks: Sequence[int]):
        self.wanted = set(ranks)
        self.of: dict[int, dict[int, dict]] = {}

    @property
    def done(self) -> bool:
        return not self.wanted

    def visit(self, rank: int, nodes, groups) -> None:
        if rank in self.wanted:
            from .timeline import node_details

            self.wanted.discard(rank)
            self.of[rank] = node_details(nodes, groups)


class HtsimLimits:
    """Refuse what htsim cannot run: a message over its frontend's ``int``, a rank whose
    kernels alone outlast its time limit."""

    def __init__(self, net: netmodel.Network, max_message: int, time_limit_ns: int,
                 roofline: tuple[float, float] | None):
        self.net, self.max_message, self.limit, self.roofline = net, max_message, time_limit_ns, roofline
        self.problem: UsageError | None = None
        self._largest: dict[tuple, int] = {}

    done = False

    def _message(self, node, groups) -> int:
        size = node.attr("comm_size", 0)
        if node.type == NodeType.COMM_SEND:
            return size
        key = (node.attr("comm_type"), size, node.attr("pg_name"))
        got = self._largest.get(key)
        if got is None:
            kind = COMM_KEYS.get(key[0])
            members = groups.get(str(key[2])) if key[2] is not None else range(self.net.world)
            got = self.net.largest_message(kind, size, list(members)) if kind and members else size
            self._largest[key] = got
        return got

    def _kernel_ns(self, node) -> int:
        if self.roofline is None:
            return max(1, node.duration_micros * 1000)
        return hardware.roofline_ns(node.attr("num_ops", 0), node.attr("tensor_size", 0), *self.roofline)

    def visit(self, rank: int, nodes, groups) -> None:
        if self.problem is not None:
            return
        compute = 0
        for node in nodes:
            if node.type == NodeType.COMP:
                compute += self._kernel_ns(node)
            elif node.type in (NodeType.COMM_SEND, NodeType.COMM_COLL):
                size = self._message(node, groups)
                if size > self.max_message:
                    what = "a send" if node.type == NodeType.COMM_SEND else "a collective"
                    self.problem = UsageError(
                        f"htsim cannot run rank {rank}'s node {node.id} ({node.name}): {what} handing the network "
                        f"a message of {size:,} bytes; its frontend holds a message's size in a C int, "
                        f"{self.max_message:,} bytes at most (2^31 - 1 less TCP's extra packet); use "
                        "--backend analytical, or smaller micro-batches")
                    return
        if compute > self.limit:
            self.problem = UsageError(
                f"htsim cannot run a step past {self.limit / 1e9:g} s of simulated time (a message that starts "
                f"later aborts it, and every run ends at 4 s), and rank {rank}'s kernels alone take "
                f"{compute / 1e9:,.3f} s (one at a time); use --backend analytical")


def scan(host: PluginHost, root: Path, *, validate: bool, checks: Sequence, progress=None) -> None:
    """Read the set at ``root`` once: validate it (``validate``) and run ``checks`` on its
    ranks; raise the validator's problems first, then the first check's refusal.
    ``progress`` (:class:`stage_core.api.Progress`) shows the ranks read.

    Without a backend that reads the set installed, there is nothing to read it with.
    """
    checks = list(checks)
    if not validate and not checks:
        return
    if not any(b.read and b.detect and b.detect(root) for b in host.backends()):
        return
    trace_set = read_trace_set(host, root)
    groups = {str(k): v for k, v in trace_set.comm_groups.items()}
    inner = trace_set.iter_ranks
    progress = progress or Progress("off")
    ranks = trace_set.world_size if trace_set.ranks is None else len(trace_set.ranks)

    with progress.phase("validating" if validate else "reading the set", ranks, "ranks") as done:
        def iter_ranks():
            for rank, nodes in inner():
                for check in checks:
                    check.visit(rank, nodes, groups)
                yield rank, nodes
                done(1)

        if validate:
            problems = validate_trace_set(dataclasses.replace(trace_set, iter_ranks=iter_ranks))
            if problems:
                raise TraceError([str(p) for p in problems])
        else:
            for _ in iter_ranks():
                if all(c.done for c in checks):
                    break
    for check in checks:
        if check.problem is not None:
            raise check.problem
