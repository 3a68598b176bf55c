"""What one layer costs under one way of splitting it: measured once on a two-layer model and
shared by every plan that splits its layers the same way.

A *layer key* is what fixes a transformer layer's work on one rank: tp, cp, ep, etp,
sequence parallel, recompute, the micro-batch size, the sequence length.  Plans that
differ only in pp, virtual stages, dp, ZeRO, schedule and micro-batch count run the
very same layers (the graph's b is the micro-batch of all of dp, which dp shards back).
So per layer key one small plan is lowered and timed exactly as ``stage estimate``
lowers and times any plan (:func:`stage_core.api.plan_job` with the GPU, the
estimator's network): three pipeline stages of one layer each, one micro-batch, no
ZeRO.  The middle stage is one layer; what the first stage (the embedding) and the
last stage (the LM head and loss) add is their difference from it:

* the forward and the backward of one micro-batch (ns): each step's own nodes replayed
  alone under the simulator's rules (one compute slot, one communication slot), so a
  TP collective the next kernel waits for counts and one that overlaps compute does not;
* parameters, gradients and optimizer state per rank (bytes, unsharded by ZeRO), and
  the activations one micro-batch keeps (the lowering's own accounting);
* the optimizer kernels (ns), the gradients per rank (elements reduced over dp), the
  activation a pipeline stage sends on, and whether the steps hold foreground
  collectives (which then queue behind that send in the one communication slot).

Models whose layers are all alike are supported; :func:`uniform_layers` says whether a
model is one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import gcd
from typing import Mapping

from stage_core.api import DTYPE_BYTES, Mesh, NodeType, Plan, Timing, UsageError, netmodel, plan_job, replay
from stage_core.records import HardwareSpec

from .estimate import _KIND, _World

#: the plan fields that make a layer key
KEY_FIELDS = ("tp", "cp", "ep", "etp", "sp", "recompute", "micro_batch_size", "cp_comm", "moe_dispatcher")


def layer_key(plan: Plan) -> tuple:
    return tuple(getattr(plan, f) for f in KEY_FIELDS)


@dataclass(frozen=True)
class Part:
    """One micro-batch's numbers for one layer, or for what a first or last stage adds."""

    fwd_ns: float
    bwd_ns: float
    fwd_comm_ns: float  # its collectives' time (what holds the one communication slot)
    bwd_comm_ns: float
    params: int  # bytes per rank
    grads: int  # bytes per rank (ZeRO 0)
    optimizer: int  # bytes per rank (ZeRO 0)
    activations: int  # bytes kept per micro-batch
    adam_ns: float  # optimizer kernels (ZeRO 0)
    grad_elements: int  # elements reduced over the data-parallel group
    model_flops: int  # per rank, Megatron's convention (3x the forward matmuls)


@dataclass(frozen=True)
class Windows:
    """Where a step's compute lies between its foreground communications (ns): what the
    overlap placement may fill with background communication in each window (compute
    after a send less the send's own estimate), and the compute after the last one."""

    usable: tuple[float, ...]
    tail: float


@dataclass(frozen=True)
class LayerCosts:
    layer: Part
    first: Part  # what the first stage adds (the embedding)
    last: Part  # what the last stage adds (the LM head and the loss)
    send_bytes: int  # the activation (and its gradient) a stage sends per micro-batch
    foreground: bool  # steps hold TP/CP/EP collectives
    fwd_windows: Windows  # one layer's forward and backward (the middle stage's step)
    bwd_windows: Windows


def scaled(costs: LayerCosts, factor: int) -> LayerCosts:
    """The memory of ``costs`` at ``factor`` times the micro-batch size: activations grow with
    it exactly, parameters, gradients and optimizer state do not (its times are not scaled:
    for a memory check only)."""
    def part(p: Part) -> Part:
        return dataclasses.replace(p, activations=p.activations * factor)

    return dataclasses.replace(costs, layer=part(costs.layer), first=part(costs.first), last=part(costs.last))


def uniform_layers(forward) -> bool:
    """Whether every transformer layer of the forward graph runs the same ops."""
    by_layer: dict[int, list] = {}
    for op in forward.ops:
        if op.layer is not None:
            by_layer.setdefault(op.layer, []).append((op.fn, op.spec, op.block))
    return len({tuple(v) for v in by_layer.values()}) <= 1


def probe_plan(plan: Plan) -> Plan:
    """The three-stage plan of one layer each with ``plan``'s layer key."""
    dp = plan.ep // gcd(plan.ep, plan.cp)  # ep is carved out of dp x cp
    return Plan(tp=plan.tp, cp=plan.cp, ep=plan.ep, etp=plan.etp, sp=plan.sp, recompute=plan.recompute,
                micro_batch_size=plan.micro_batch_size, cp_comm=plan.cp_comm, moe_dispatcher=plan.moe_dispatcher,
                moe_capacity_factor=plan.moe_capacity_factor, moe_imbalance=plan.moe_imbalance,
                seq_len=plan.seq_len, grad_dtype=plan.grad_dtype, optimizer_dtype=plan.optimizer_dtype,
                pp=3, dp=dp, micro_batches=1)


def measure(host, model: str, overrides: Mapping[str, str], plan: Plan, hw: HardwareSpec) -> LayerCosts:
    """The layer costs of ``plan``'s layer key (see the module docstring)."""
    first, layer, last, send, foreground, windows = _stage_parts(host, model, overrides, probe_plan(plan), hw)
    return LayerCosts(layer, _minus(first, layer), _minus(last, layer), send, foreground, *windows)


def _minus(a: Part, b: Part) -> Part:
    return Part(*(x - y for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b))))


def _stage_parts(host, model, overrides, probe: Plan, hw: HardwareSpec):
    """(each stage's Part, send bytes, foreground) of the probe."""
    layers = probe.pp
    try:
        result = plan_job(host, model, {**overrides, "layers": str(layers)}, probe, hw)
    except UsageError as exc:
        raise UsageError(f"cannot measure a layer of {model} with {_key_text(probe)}: {exc}") from None
    world = _World(result.job, netmodel.Network.of(hw, result.job.world_size))
    mesh = Mesh.from_plan(result.plan)
    grad_item = DTYPE_BYTES[probe.grad_dtype]
    parts, send, foreground = [], 0, False
    for s, (program, report) in enumerate(zip(result.job.programs, result.reports)):
        nodes = program.nodes
        steps: dict[str, list[int]] = {"F": [], "B": []}
        adam = 0.0
        for pos, node in enumerate(nodes):
            phase = _phase(node.name)
            if phase in steps:
                steps[phase].append(pos)
                if node.type == NodeType.COMM_COLL:
                    foreground = True
            elif node.name.startswith("optimizer.") and node.type == NodeType.COMP:
                adam += world.durations[s][pos]
            if node.type == NodeType.COMM_SEND and phase == "send" and s == 0:
                send = node.comm_size
        mem = report.memory_bytes
        durations = world.durations[s]
        comm = {k: sum(durations[p] for p in v if nodes[p].type == NodeType.COMM_COLL) for k, v in steps.items()}
        if s == 1:
            timing = Timing(hw, None, mesh, program.ranks[0])
            windows = tuple(_windows(nodes, steps[k], durations, timing) for k in ("F", "B"))
        parts.append(Part(_alone(nodes, steps["F"], durations), _alone(nodes, steps["B"], durations),
                          comm["F"], comm["B"], mem["parameters"], mem["gradients"], mem["optimizer"],
                          sum(report.chunk_activations.values()), adam, mem["gradients"] // grad_item,
                          report.flops["model"]))
    return (*parts, send, foreground, windows)


def _phase(name: str) -> str:
    """F or B for a node of micro-batch 0's forward or backward (recompute included),
    "send"/"recv" for its pipeline messages, "" for the rest (buckets, optimizer)."""
    parts = name.split(".")
    if len(parts) < 3 or not parts[0].startswith("mb"):
        return ""
    step = parts[2]
    if ":send" in step:
        return "send"
    if ":recv" in step:
        return "recv"
    return {"fwd": "F", "bwd": "B", "recompute": "B"}.get(step, "")


def _windows(nodes, positions: list[int], durations: list[float], timing) -> Windows:
    """The compute between consecutive foreground communications of one step, as
    :func:`stage_core.parallel.overlap.place` measures it (a window after a send less
    the send's estimate), and the compute after the last."""
    usable: list[float] = []
    current, opener = None, None
    for p in positions:
        node = nodes[p]
        if node.type == NodeType.COMP:
            if current is not None:
                current += durations[p]
        elif node.type in (NodeType.COMM_COLL, NodeType.COMM_SEND):
            if current is not None:
                usable.append(current - (timing.comm_seconds(opener, opener.comm_size) * 1e9
                                         if opener.type == NodeType.COMM_SEND else 0.0))
            current, opener = 0.0, node
    return Windows(tuple(usable), current or 0.0)


def _alone(nodes, positions: list[int], durations: list[float]) -> float:
    """The time ``positions`` (one step's nodes) take replayed on their own: one compute
    slot and one communication slot, dependencies outside the step taken as met."""
    if not positions:
        return 0.0
    where = {p: i for i, p in enumerate(positions)}
    kinds = bytes(_KIND[nodes[p].type] for p in positions)
    deps = tuple(tuple(dict.fromkeys(where[d] for d in (*nodes[p].data_deps, *nodes[p].ctrl_deps) if d in where))
                 for p in positions)
    users: list[list[int]] = [[] for _ in positions]
    for i, mine in enumerate(deps):
        for d in mine:
            users[d].append(i)
    ids = tuple(range(len(positions)))
    program = replay.Program(ids, (), kinds, deps, tuple(map(tuple, users)), {}, {}, True, ())
    links = replay.Links([{}], [], [], [{}])
    sends: dict[tuple, list[int]] = {}
    for i, p in enumerate(positions):
        node = nodes[p]
        if node.type == NodeType.COMM_COLL:  # a collective inside the class meets only itself
            links.rendezvous[0][i] = len(links.members)
            links.members.append(((0, i),))
            links.complete.append(True)
        elif node.type == NodeType.COMM_SEND:  # a ring inside the class (context parallel)
            sends.setdefault((node.tag, node.comm_size), []).append(i)
    for i, p in enumerate(positions):
        node = nodes[p]
        if node.type == NodeType.COMM_RECV:
            mine = sends.get((node.tag, node.comm_size))
            links.sender[0][i] = (0, mine.pop(0)) if mine else None
    times = [durations[p] for p in positions]
    done = replay.run([program], links, lambda _, i: times[i])
    if done.finish[0] is None:
        raise ValueError("a probe step does not finish on its own")
    return done.finish[0]


def _key_text(plan: Plan) -> str:
    return " ".join(f"{f}={getattr(plan, f)}" for f in KEY_FIELDS)
