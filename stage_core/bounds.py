"""Bounded work: what a job costs is estimated before it is built, and refused above a limit.

Three estimates, each before the step it guards:

* the model graph: a family whose config has an integer ``layers`` field is built with a
  few layers first, and the ops of the full graph extrapolated from them; above
  :data:`~stage_core.ir.builder.MAX_MODEL_OPS` the job is refused, naming ``layers``.  The graph builder also
  stops at that many ops (:class:`stage_core.ir.builder.GraphBuilder`), whatever the family.
* the world: at most :data:`MAX_WORLD` ranks (and ``--max-nodes``), before anything.
* the trace set, from the forward graph: every rank runs at least its stage's forward
  kernels once per micro-batch, so ``world / pp * micro_batches * kernels`` nodes is a
  lower bound, checked against ``--max-nodes`` before the training graph is made.
* the programs, exactly: :func:`lower_within`.  Every micro-batch but the first and the
  last (which may issue extra work, such as the gradient buckets) adds the same nodes,
  FLOPs and bytes to a rank class.  So a large count ``M`` is lowered as a small one
  ``m`` (at least 4, as many micro-batches modulo ``pp`` as ``M``, so any schedule that
  takes ``M`` takes ``m``); the lowering records what each schedule step added, and
  the costs at ``M`` are those at ``m`` plus ``M - m`` times those of micro-batch 1,
  once micro-batch ``m - 2`` is seen to cost the same.  The activation peak comes from
  walking the schedule's step order with each chunk's activation bytes (checked against
  the lowering's own peak at ``m``); a long order is walked at three counts past its
  warm-up and extrapolated.  ``report`` stops there: 100,000 micro-batches cost one
  lowering of at most 4 + pp - 1.  ``generate`` compares the node count with
  ``--max-nodes`` and only then lowers in full.  When the costs do not repeat (a
  lowering or schedule whose micro-batches differ), the plan is lowered in full.

Every node value must fit the int64 that Chakra ET stores; a larger one is refused,
naming the node and the value.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Callable, Sequence

from .errors import UsageError
from .ir import builder
from .parallel.lower import ClassReport, Lowered, Step
from .parallel.plan import Plan
from .timing import node_kernel
from .trace import NodeType

#: a schedule: (stages, micro-batches, virtual stages) -> each stage's steps
Order = Callable[[int, int, int], Sequence[Sequence[tuple[str, int, int]]]]

#: default of --max-nodes: nodes of a trace set, all ranks together (~100 GB as Chakra ET)
DEFAULT_MAX_NODES = 1_000_000_000
#: the most ranks STAGE lays out (a report of 2**20 ranks takes ~5 s and ~250 MB; its
#: rank lists and groups grow with the world)
MAX_WORLD = 1 << 20
#: the largest value a node attribute may hold (Chakra ET stores int64)
INT64_MAX = (1 << 63) - 1
#: rough size of a node in a Chakra ET file, for messages
BYTES_PER_NODE = 100
#: node fields that carry sizes and counts
_VALUES = ("num_ops", "tensor_size", "comm_size")
#: micro-batches lowered, at least, for a report of more (see sample_count)
SAMPLE_MICRO_BATCHES = 4
#: schedule steps of all stages walked for an activation peak, at most
MAX_WALK_STEPS = 1 << 16


def check_model_size(spec, config) -> None:
    """Refuse, before building it, a model whose graph would pass ``builder.MAX_MODEL_OPS`` ops.

    Families without an integer ``layers`` field (a hybrid's layers come from its pattern)
    are left to the builder's own limit.
    """
    fields = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
    layers = getattr(config, "layers", None) if "layers" in fields else None
    if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 8:
        return
    counts = _ops_per_layer(spec, config)
    if counts is None:
        return
    base, per_layer, at = counts
    estimate = base + per_layer * (layers - at)
    if estimate > builder.MAX_MODEL_OPS:
        raise UsageError(
            f"{config.name} layers={layers}: its graph would have about {estimate:,} ops ({per_layer} per layer), "
            f"more than the {builder.MAX_MODEL_OPS:,} STAGE builds; give fewer layers"
        )


def _ops_per_layer(spec, config) -> tuple[int, int, int] | None:
    """(ops at k layers, ops per extra layer, k) from builds at k and k + 1 layers, for the
    smallest k the config accepts (a model may need a few dense layers first)."""
    for k in range(1, 9):
        try:
            with builder.kernel_scope(spec.kernels):  # the family's registered kernels
                small = len(spec.build(config.replace(layers=k)).ops)
                larger = len(spec.build(config.replace(layers=k + 1)).ops)
        except UsageError:
            continue
        return small, larger - small, k
    return None


def check_world(plan: Plan, max_nodes: int | None) -> None:
    """Refuse a world above MAX_WORLD ranks, or above ``max_nodes`` (each rank writes a node)."""
    world = plan.world_size
    what = f"world size {world:,} (tp {plan.tp} x cp {plan.cp} x dp {plan.dp} x pp {plan.pp})"
    if world > MAX_WORLD:
        raise UsageError(f"{what} is above the {MAX_WORLD:,} ranks STAGE lays out; lower the degrees")
    if max_nodes is not None and world > max_nodes:
        raise UsageError(f"{what} exceeds --max-nodes {max_nodes:,}: each rank writes at least one node; "
                         f"lower the degrees or raise --max-nodes")


def check_lower_bound(kernels: int, plan: Plan, max_nodes: int) -> None:
    """Refuse a plan whose ranks run more forward kernels than ``max_nodes`` (every rank
    runs its stage's forward kernels once per micro-batch; the stages split them)."""
    least = plan.world_size // plan.pp * plan.micro_batches * kernels
    if least > max_nodes:
        raise UsageError(_too_many(least, plan, max_nodes, "at least "))


def _too_many(nodes: int, plan: Plan, max_nodes: int, qualifier: str = "") -> str:
    return (f"the trace set would hold {qualifier}{nodes:,} nodes (about {_size(nodes * BYTES_PER_NODE)}), above "
            f"--max-nodes {max_nodes:,}: lower --micro-batches ({plan.micro_batches}) or the degrees, "
            f"or raise --max-nodes")


def _size(nbytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if nbytes < 1000 or unit == "PB":
            return f"{nbytes:.3g} {unit}" if unit != "B" else f"{nbytes} B"
        nbytes /= 1000
    return f"{nbytes} B"


def set_nodes(lowered: Lowered) -> int:
    """Nodes of the set: each class's nodes times its ranks."""
    return sum(r.nodes * len(r.ranks) for r in lowered.reports)


def sample_count(plan: Plan) -> int | None:
    """The micro-batch count lowered instead of the plan's, when that is larger: the
    smallest count of at least 4 with as many micro-batches modulo pp (so any schedule
    that takes the plan's count takes it); None when the plan's count is that small."""
    m = plan.micro_batches
    sample = SAMPLE_MICRO_BATCHES + (m - SAMPLE_MICRO_BATCHES) % plan.pp
    return sample if m > sample else None


def lower_within(lower: Callable[[Plan], Lowered], plan: Plan, max_nodes: int | None,
                 programs: bool = True, order: Order | None = None) -> Lowered:
    """``lower(plan)``, bounded (see the module doc); ``order`` is the schedule's step order.

    ``max_nodes``: refuse a set of more nodes (None: no limit).  ``programs``: False
    when only the reports are wanted (``report``): a large micro-batch count is then
    extrapolated (an :class:`Extrapolated`, without programs), never lowered in full.
    """
    sample = sample_count(plan)
    small = None
    if sample is not None and order is not None:
        try:
            small = lower(plan.replace(micro_batches=sample))
        except UsageError:  # a schedule that needs more micro-batches than that (DualPipeV: 2 x pp): a larger one
            larger = 4 * plan.pp * plan.virtual_stages
            larger += (plan.micro_batches - larger) % plan.pp
            sample = larger if plan.micro_batches > larger else None
            if sample is not None:
                small = lower(plan.replace(micro_batches=sample))
    if small is not None:
        check_values(small)
        reports = _extrapolate(small, plan, sample, order)
        if reports is not None:
            estimate = Extrapolated([], reports, small.group_keys, small.stage_layers, small, sample,
                                    plan.micro_batches)
            _check_nodes(estimate, plan, max_nodes)
            return lower(plan) if programs else estimate
    lowered = lower(plan)  # a small count, or costs that vary from one micro-batch to the next
    check_values(lowered)
    _check_nodes(lowered, plan, max_nodes)
    return lowered


def _check_nodes(lowered: Lowered, plan: Plan, max_nodes: int | None) -> None:
    if max_nodes is not None and set_nodes(lowered) > max_nodes:
        raise UsageError(_too_many(set_nodes(lowered), plan, max_nodes))


@dataclass
class Extrapolated(Lowered):
    """The reports of ``micro_batches`` micro-batches from a lowering of ``sample_count``
    (``sample``); no programs."""

    sample: Lowered | None = None
    sample_count: int = 0
    micro_batches: int = 0

    def compute_micros(self, seconds: Callable) -> list[int]:
        """Compute microseconds per rank class (as :func:`stage_core.timing.time_programs`
        sums them, up to float rounding): the sample's, plus its generic micro-batch's
        times the micro-batches added."""
        out = []
        for program, report in zip(self.sample.programs, self.sample.reports):
            total = each = 0.0
            generic = set(_generic_nodes(report))
            for i, node in enumerate(program.nodes):
                if node.type == NodeType.COMP:
                    us = seconds(node_kernel(node)) * 1e6
                    total += us
                    if i in generic:
                        each += us
            out.append(round(total + each * (self.micro_batches - self.sample_count)))
        return out


#: the micro-batch whose costs stand for every added one: neither the first nor the last
GENERIC = 1


def _generic_nodes(report: ClassReport, micro_batch: int = GENERIC) -> list[int]:
    """Indices of the nodes the steps of ``micro_batch`` emitted."""
    out, before = [], 0
    for step in report.steps:
        if step.micro_batch == micro_batch:
            out.extend(range(before, step.nodes))
        before = step.nodes
    return out


def _deltas(report: ClassReport, micro_batch: int) -> tuple[int, int, dict, dict, dict]:
    """(nodes, kernel bytes, FLOPs, bytes moved, bytes on the link) the steps of ``micro_batch`` added."""
    nodes = kernel_bytes = 0
    flops = dict.fromkeys(report.flops, 0)
    comm = dict.fromkeys(report.comm_bytes, 0)
    wire = dict.fromkeys(report.wire_bytes, 0)
    before = Step(-1, 0, dict.fromkeys(flops, 0), dict.fromkeys(comm, 0), 0, dict.fromkeys(wire, 0))
    for step in report.steps:
        if step.micro_batch == micro_batch:
            nodes += step.nodes - before.nodes
            kernel_bytes += step.kernel_bytes - before.kernel_bytes
            for key in step.flops:
                flops[key] += step.flops[key] - before.flops[key]
            for key in step.comm:
                comm[key] += step.comm[key] - before.comm[key]
            for key in step.wire:
                wire[key] += step.wire[key] - before.wire.get(key, 0)
        before = step
    return nodes, kernel_bytes, flops, comm, wire


def _extrapolate(sample: Lowered, plan: Plan, count: int, order: Order) -> list[ClassReport] | None:
    """The reports at ``plan.micro_batches`` from ``sample``, lowered at ``count``; None
    when the sample does not show costs that repeat per micro-batch (two micro-batches
    in the middle differ, or the activation walk does not give the sample's peak)."""
    added = plan.micro_batches - count
    out = []
    for stage, report in enumerate(sample.reports):
        generic = _deltas(report, GENERIC)
        if not report.steps or generic != _deltas(report, count - 2):
            return None
        nodes, kernel_bytes, flops, comm, wire = generic
        acts = (report.chunk_activations, report.chunk_hold)
        if _peak(order, plan, count, stage, acts) != report.memory_bytes["activations"]:
            return None
        peak = _peak_at(order, plan, stage, acts)
        if peak is None:
            return None
        memory = dict(report.memory_bytes, activations=peak)
        memory["total"] = report.memory_bytes["total"] - report.memory_bytes["activations"] + peak
        flops_at = {k: v + added * flops.get(k, 0) for k, v in report.flops.items() if k != "total"}
        flops_at["total"] = flops_at["matmul"] + flops_at["other"]
        out.append(ClassReport(report.ranks, flops_at, memory,
                               {k: v + added * comm[k] for k, v in report.comm_bytes.items()},
                               nodes=report.nodes + added * nodes,
                               kernel_bytes=report.kernel_bytes + added * kernel_bytes,
                               wire_bytes={k: v + added * wire.get(k, 0) for k, v in report.wire_bytes.items()}))
    return out


def _peak(order: Order, plan: Plan, count: int, stage: int, acts: tuple[dict[int, int], dict[int, int]]) -> int:
    """Activation bytes stage ``stage`` holds at most over the schedule's steps: a forward
    keeps its chunk's activations until that micro-batch's backward frees them; a split
    backward's B keeps what its W reads (``acts``: per chunk, the activations and that
    hold) until the W."""
    from .schedule.steps import chunk_of, flat_steps

    kept, hold = acts
    placement = getattr(order, "placement", "loop")
    steps = flat_steps(order(plan.pp, count, plan.virtual_stages)[stage])
    split = {(m, local) for kind, m, local in steps if kind == "W"}
    live = peak = 0
    for kind, m, local in steps:
        chunk = chunk_of(placement, stage, local, plan.pp)
        if kind == "F":
            live += kept[chunk]
            peak = max(peak, live)
        elif kind == "B":
            live -= kept.get(chunk, 0)
            if (m, local) in split:
                live += hold.get(chunk, 0)
                peak = max(peak, live)
        else:
            live -= hold.get(chunk, 0)
    return peak


def _peak_at(order: Order, plan: Plan, stage: int, acts: tuple[dict[int, int], dict[int, int]]) -> int | None:
    """The activation peak at the plan's micro-batch count: walked when the schedule is
    short, else extrapolated from walks at three counts past the warm-up (None if those
    are not affine)."""
    m, pp = plan.micro_batches, plan.pp
    if m * pp * plan.virtual_stages <= MAX_WALK_STEPS:
        return _peak(order, plan, m, stage, acts)
    first = 4 * pp * plan.virtual_stages
    first += (m - first) % pp
    a, b, c = (_peak(order, plan, first + k * pp, stage, acts) for k in range(3))
    if b - a != c - b:
        return None
    return a + (b - a) * ((m - first) // pp)


def check_values(lowered: Lowered) -> None:
    """Refuse a node whose FLOPs or bytes do not fit Chakra ET's int64, naming it."""
    for program in lowered.programs:
        for node in program.nodes:
            for field in _VALUES:
                value = getattr(node, field)
                if value > INT64_MAX:
                    raise UsageError(
                        f"node {node.name!r} ({program.label or 'rank class'}) has {field} {value:,}, above the "
                        f"int64 limit {INT64_MAX:,} a Chakra trace holds; give a smaller model or batch, or "
                        f"larger degrees"
                    )
