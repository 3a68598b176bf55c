"""Lowering: a propagated training graph -> one concrete program per rank class.

Numbers enter here, once: every size expression of the graph is compiled into one
numeric function and evaluated for the plan's dims; local sizes divide the
sharded letters by their degrees.  The program runs the schedule's steps (forward
and backward of each micro-batch), each op with the collectives its placements
need, then the gradient sync in buckets and the optimizer.  Programs name groups
by axis key and peers by offset; a backend stamps them per rank.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import cached_property
from fractions import Fraction
from math import prod
from typing import Iterable

import numpy as np

from .. import hardware, sym
from ..errors import UsageError
from ..ir import kernels
from ..kernel import Kernel, kernel
from ..records import HardwareSpec
from ..timing import node_kernel
from ..ir.ops import BACKWARD, FORWARD, MATMUL, OPTIMIZER, Op, parse_spec
from ..ir.tensor import DTYPE_BYTES, Role, Tensor
from ..trace import COMM_KEYS, CollectiveType, NodeType, ProgramNode, RankProgram
from .mesh import Mesh
from .placement import FLAT, Partial, Replicate, Shard, layout_key
from .plan import Plan
from .overlap import Background, place
from .propagate import OpPlan, Propagation, Redistribute
from ..schedule.orders import one_f_one_b
from ..schedule.steps import chunk_of, copies, flat_steps, is_pair, stage_of


@dataclass(frozen=True)
class Step:
    """A program after one schedule step: the step's micro-batch, the nodes, FLOPs and
    bytes moved so far."""

    micro_batch: int
    nodes: int
    flops: dict[str, int]
    comm: dict[str, int]
    kernel_bytes: int = 0
    wire: dict[str, int] = field(default_factory=dict)  # the bytes on the link so far (see ClassReport)


@dataclass
class ClassReport:
    """What one rank of a class computes, holds and moves in one training step.

    ``nodes``: the nodes of each rank's program; ``kernel_bytes``: the bytes its kernels
    read and write (the compute nodes' tensor_size, a kernel with none counted 0).
    ``comm_bytes``: per collective type, the sum of its ``comm_size`` (ASTRA-sim's input
    size, REFERENCE §6), and the bytes sent and received; ``wire_bytes``: what the same
    collectives put on each rank's link by the ring algorithm
    (:func:`stage_core.hardware.wire_bytes`; sends and receives as they are).
    """

    ranks: tuple[int, ...]
    flops: dict[str, int]
    memory_bytes: dict[str, int]
    comm_bytes: dict[str, int]
    nodes: int = 0
    kernel_bytes: int = 0
    # for stage_core.bounds (a large micro-batch count from a small one): the program's
    # state after each schedule step, and the activation bytes a micro-batch keeps per chunk
    steps: list[Step] = field(default_factory=list, repr=False)
    chunk_activations: dict[int, int] = field(default_factory=dict, repr=False)
    chunk_hold: dict[int, int] = field(default_factory=dict, repr=False)  # kept from a split B to its W
    wire_bytes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "ranks": list(self.ranks),
            "flops": dict(self.flops),
            "memory_bytes": dict(self.memory_bytes),
            "comm_bytes": dict(self.comm_bytes),
            "wire_bytes": dict(self.wire_bytes),
            "kernel_bytes": self.kernel_bytes,
            "nodes": self.nodes,
        }


@dataclass
class Lowered:
    programs: list[RankProgram]
    reports: list[ClassReport]
    group_keys: set[str] = field(default_factory=set)
    stage_layers: tuple[int, ...] = ()  # layers per pipeline chunk, in chunk order


class Sizes:
    """Numeric values of every size expression the graph uses, evaluated once.

    Sizes are whole numbers, except the slots of a MoE expert (the letter ``c`` of a
    dispatch, tokens·k/E per expert): tokens spread over experts in whole numbers, some
    experts a row more than others, so the slots per expert are an exact fraction whose
    product with the experts (``e·c``, which every expert op and tensor has) is whole.
    With a capacity factor each rank pads every expert to Megatron's capacity
    ⌈tokens·k·cf/E⌉ of its own tokens.  With an imbalance factor every rank is sized as
    the one holding the busiest expert (see :func:`busiest_rank_rows`).
    """

    def __init__(self, prop: Propagation, values: dict[str, int], plan: Plan | None = None, evaluators=None):
        g = prop.sharded.graph
        self.prop = prop
        self.plan = plan or Plan()
        self.degrees = prop.sharded.degrees
        dispatches = [op for op in prop.ops if op.phase == FORWARD and op.attrs.get("moe") == "dispatch"]
        slots = {op.attrs["capacity"] for op in dispatches}
        if evaluators is None:
            exprs: dict = {}
            for op in prop.ops:
                for e in op.letter_sizes.values():
                    exprs.setdefault(e, None)
                for t in op.inputs + op.outputs:
                    for d in t.shape:
                        exprs.setdefault(d, None)
            for t in list(g.params) + list(g.inputs):
                for d in t.shape:
                    exprs.setdefault(d, None)
            evaluators = sym.Evaluator([e for e in exprs if e not in slots])
        self.evaluators = evaluators
        try:
            numbers = evaluators(values)
        except ValueError as exc:
            raise UsageError(f"model sizes do not come out whole for this plan: {exc}") from None
        self.value: dict = dict(zip(evaluators.exprs, numbers))
        for op in dispatches:
            self.value[op.attrs["capacity"]] = self._slots(prop, op, self.plan)

    def at(self, values: dict[str, int]) -> "Sizes":
        """The same sizes for another binding of the dims (compiled once)."""
        return Sizes(self.prop, values, self.plan, self.evaluators)

    def _slots(self, prop: Propagation, op: Op, plan: Plan):
        """Slots per expert of a dispatch, over the whole graph's tokens (b·s·k/E when dropless)."""
        x, weights = op.inputs
        token_axes = [a for a, p in prop.plan(op).in_layouts[0].items() if isinstance(p, Shard)]
        sources = self.deg(token_axes)  # ranks whose tokens the graph's b·s covers
        tokens = prod(self.value[d] for d in x.shape[:-1]) // sources  # one rank's tokens
        experts = self.value[weights.shape[-1]]
        k = int(op.attrs["experts_per_token"])
        cf = plan.moe_capacity_factor
        if cf is None and not op.attrs.get("dropless"):
            cf = op.attrs["capacity_factor"]
        if cf is not None:  # Megatron's get_capacity, on each rank's own tokens
            rows = experts * -(-(tokens * k * Fraction(str(cf))) // experts)
        else:
            rows = busiest_rank_rows(tokens * k, experts, self.degrees.get("ep", 1), plan.moe_imbalance)
        return Fraction(sources * rows, experts)  # a fraction even when whole: only e·c must be

    def deg(self, axes: Iterable[str]) -> int:
        n = 1
        for a in axes:
            n *= self.degrees.get(a, 1)
        return n

    def local_letters(self, op: Op, plan: OpPlan) -> dict[str, int]:
        out = {}
        for letter, e in op.letter_sizes.items():
            size = self.value[e]
            axes = plan.letter_axes.get(letter, ())
            d = self.deg(axes)
            if isinstance(size, Fraction):  # expert slots: whole only with the experts
                out[letter] = size / d
                continue
            if size % d:
                raise UsageError(
                    f"{'×'.join(axes)} degree {d} does not divide dim {e} = {size} used by op {op.name}; "
                    f"{_fix(e, size)}"
                )
            out[letter] = size // d
        return out

    def numel(self, t: Tensor, layout: dict | None = None) -> int:
        n = 1
        shards: dict[int, int] = {}
        flat = 1
        for axis, p in (layout or {}).items():
            if isinstance(p, Shard):
                if p.dim == FLAT:
                    flat *= self.degrees.get(axis, 1)
                else:
                    shards[p.dim] = shards.get(p.dim, 1) * self.degrees.get(axis, 1)
        for i, d in enumerate(t.shape):
            size = self.value[d]
            div = shards.get(i, 1)
            if isinstance(size, Fraction):
                n *= size / div
                continue
            if size % div:
                raise UsageError(f"degree {div} does not divide dim {d} = {size} of tensor {t.name}; {_fix(d, size)}")
            n *= size // div
        return -(-_whole(n, t.name) // flat)

    def nbytes(self, t: Tensor, layout: dict | None = None) -> int:
        return self.numel(t, layout) * t.itemsize


def busiest_rank_rows(rows: int, experts: int, ep: int, imbalance) -> int | Fraction:
    """Expert rows per rank when the busiest expert gets ``imbalance`` times its uniform share.

    ``rows`` = tokens·k of one rank.  Over an ep group each expert's uniform share is
    A = ep·rows/E; the busiest gets imbalance·A and the other E−1 split the rest evenly;
    the rank holding it runs it and E/ep − 1 others:
    rows·(imbalance·ep/E + (E − ep)(E − imbalance)/(E·(E − 1))), rounded up to a whole
    row (exactly ``rows`` without imbalance, or without expert parallel).
    """
    if imbalance == 1 or experts == 1:
        return rows
    f = Fraction(str(imbalance))
    share = f * ep / experts + Fraction((experts - ep) * (experts - f), experts * (experts - 1))
    return -(-(rows * share) // 1)


def _whole(n, what: str) -> int:
    """``n`` as an int; a fraction here means a size that uses expert slots without the experts."""
    if isinstance(n, Fraction):
        if n.denominator != 1:
            raise ValueError(f"{what}: {n} is not a whole number (expert slots are whole only per expert set)")
        return n.numerator
    return n


#: the plan's dims, and the flags that set them
_PLAN_FLAGS = {"b": "--micro-batch-size (b is micro-batch size x dp)", "s": "--seq-len"}


def _fix(e, size: int) -> str:
    """What to change when a degree does not divide the dim ``e`` (of value ``size``)."""
    flags = [text for name, text in _PLAN_FLAGS.items() if name in sym.names_in(e)]
    if flags:
        return f"raise {' or '.join(flags)} so that it divides, or choose a degree that divides {size}"
    return f"choose a degree that divides {size}"


def _times(coeff, n: int) -> int:
    """coeff * n for an int or sympy-rational coefficient, rounded down to whole FLOPs."""
    if isinstance(coeff, int):
        return coeff * n
    frac = Fraction(int(coeff.p), int(coeff.q)) if hasattr(coeff, "p") else Fraction(coeff)
    return int(frac * n)


def _cost(op: Op, letters: dict[str, int]) -> tuple[int, int, int]:
    """(matmul FLOPs, other FLOPs, bytes) of one op from its local letter sizes."""
    mm = other = 0
    for coeff, lets, kind in op.flop_terms:
        value = _times(coeff, _whole(prod(letters[c] for c in lets), op.name))
        if kind == MATMUL:
            mm += value
        else:
            other += value
    # a byte coefficient may be a fraction (a scan's chunk states: 16 bytes per element per chunk of Q tokens)
    nbytes = sum(_times(per, _whole(prod(letters[c] for c in lets), op.name)) for per, lets in op.byte_terms)
    return mm, other, nbytes


class Timing:
    """What placing background communication needs to know of time (``--gpu``): each
    compute node's seconds, and a send's or collective's seconds on the network,
    for the rank class whose first rank is ``rank``."""

    def __init__(self, hw: HardwareSpec, kernel_seconds, mesh: Mesh, rank: int):
        self.hw, self.kernel_seconds, self.mesh, self.rank = hw, kernel_seconds, mesh, rank
        self._ranks: dict[str | None, list[int]] = {}

    def ranks(self, node: ProgramNode) -> list[int]:
        key = node.group if node.type == NodeType.COMM_COLL else node.peer
        got = self._ranks.get(key)
        if got is None:
            if node.type == NodeType.COMM_COLL:
                got = (self.mesh.group_members(node.group, self.rank) if node.group
                       else list(range(self.mesh.world_size)))
            else:
                got = [self.rank, self.mesh.peer(self.rank, node.peer)]
            self._ranks[key] = got
        return got

    @staticmethod
    def kind(node: ProgramNode) -> str:
        return "send" if node.type == NodeType.COMM_SEND else COMM_KEYS[node.comm_type]

    def compute_seconds(self, node: ProgramNode) -> float:
        return self.kernel_seconds(node_kernel(node))

    def comm_seconds(self, node: ProgramNode, size: int) -> float:
        return hardware.transfer_seconds(self.hw, self.kind(node), size, self.ranks(node))

    def comm_bytes(self, node: ProgramNode, seconds: float) -> int:
        return hardware.transfer_bytes(self.hw, self.kind(node), seconds, self.ranks(node))


class _Program:
    """Accumulates nodes with ids in emission order (a topological order).

    Sends and collectives form one chain (each waits on the one before it): ASTRA-sim
    keeps one of them in flight per rank, so their issue order must not depend on
    timing.  Foreground ones (pipeline sends, TP/CP/EP collectives) keep their
    emission order; background ones (gradient buckets, ZeRO-3 parameter gathers) are
    recorded with their release and placed by :func:`.overlap.place` in
    :meth:`finish`, which builds the chain over the final order (docs/design.md,
    "The one communication slot").
    """

    def __init__(self, group_size=None):
        self.nodes: list[ProgramNode] = []
        self.flops = {"matmul": 0, "other": 0}
        self.model_flops = 0  # 3 x the matmul FLOPs of the forward pass (recompute not counted)
        self.comm = {k: 0 for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv")}
        self.wire = dict.fromkeys(self.comm, 0)  # the same on the link (ring algorithm)
        self.group_size = group_size  # group key -> its ranks (for the wire bytes)
        self.tags = 0  # the last send/recv tag handed out
        self.step_tail: int | None = None  # last node of the previous schedule step
        self.step_last: int | None = None
        self.steps: list[Step] = []
        self.kernel_bytes = 0  # bytes the kernels read and write
        self.chunk_acts: dict[int, int] = {}  # activation bytes a micro-batch keeps in each chunk
        self.chunk_hold: dict[int, int] = {}  # of which a split backward's W still holds after its B
        self.background: dict[int, Background] = {}
        self.last_gather: int | None = None  # the step's last parameter gather (ZeRO-3)
        self.gathered: dict[tuple, tuple[int, ...]] = {}  # kept gathered parameters: (tensor, layout key) -> gather
        self.not_before: int | None = None  # nodes emitted now wait for this one (recompute)

    def _deps(self, deps) -> tuple[tuple[int, ...], tuple[int, ...]]:
        data = tuple(sorted(set(deps)))
        ctrl: tuple[int, ...] = ()
        if not data and self.step_tail is not None:
            ctrl = (self.step_tail,)
        if self.not_before is not None and self.not_before not in data and self.not_before not in ctrl:
            ctrl = tuple(sorted((*ctrl, self.not_before)))
        return data, ctrl

    def comp(self, name: str, mm: int, other: int, nbytes: int, deps, kernel: Kernel | None = None) -> int:
        data, ctrl = self._deps(deps)
        nid = len(self.nodes)
        kind = "matmul" if mm else "other"
        # ASTRA-sim's roofline divides num_ops by a rate derived from num_ops/tensor_size:
        # a kernel with no arithmetic (a gather) is written as 1 op so that it is timed
        # by its bytes; reports count its real FLOPs (0).
        self.nodes.append(ProgramNode(nid, name, NodeType.COMP, data, ctrl, num_ops=max(mm + other, 1),
                                      tensor_size=max(nbytes, 1), flops_kind=kind, kernel=kernel))
        self.flops["matmul"] += mm
        self.flops["other"] += other
        self.kernel_bytes += nbytes
        self.step_last = nid
        return nid

    def coll(self, name: str, kind: CollectiveType, size: int, group: str, deps,
             release: int | None = None, group_size: int = 1) -> int:
        """A collective; with ``release`` a background one, free to run once node
        ``release`` is emitted (-1: from the start)."""
        data, ctrl = self._deps(deps)
        nid = len(self.nodes)
        self.nodes.append(ProgramNode(nid, name, NodeType.COMM_COLL, data, ctrl, comm_type=kind,
                                      comm_size=size, group=group))
        self.comm[COMM_KEYS[kind]] += size
        n = self.group_size(group) if self.group_size is not None else group_size
        self.wire[COMM_KEYS[kind]] += hardware.wire_bytes(COMM_KEYS[kind], size, n)
        if release is None:
            self.step_last = nid
        else:
            self.background[nid] = Background(nid, max((release, *data, *ctrl)), group_size)
        return nid

    def p2p(self, name: str, kind: NodeType, size: int, peer: str, tag: int, deps) -> int:
        data, ctrl = self._deps(deps)
        nid = len(self.nodes)
        self.nodes.append(ProgramNode(nid, name, kind, data, ctrl, comm_size=size, peer=peer, tag=tag))
        self.comm["send" if kind == NodeType.COMM_SEND else "recv"] += size
        self.wire["send" if kind == NodeType.COMM_SEND else "recv"] += size
        self.step_last = nid
        return nid

    def next_tag(self) -> int:
        self.tags += 1
        return self.tags

    def end_step(self, micro_batch: int):
        self.step_tail = self.step_last
        self.steps.append(Step(micro_batch, len(self.nodes), {**self.flops, "model": self.model_flops},
                               dict(self.comm), self.kernel_bytes, dict(self.wire)))
        self.last_gather = None

    def finish(self, timing: "Timing | None" = None) -> None:
        """Place the background collectives and chain every send and collective (the
        steps' node counts follow the nodes they stood with)."""
        if timing is None:
            self.nodes, anchors = place(self.nodes, self.background)
        else:
            self.nodes, anchors = place(self.nodes, self.background, timing.compute_seconds, timing.comm_seconds,
                                        timing.comm_bytes)
        self.steps = [dataclasses.replace(s, nodes=bisect_left(anchors, s.nodes)) for s in self.steps]


class Lowerer:
    #: model FLOPs per forward matmul FLOP (Megatron: forward and backward, 3x the forward's)
    model_flops_per_forward = 3

    def __init__(self, prop: Propagation, plan: Plan, mesh: Mesh, dims: dict[str, int], schedule=one_f_one_b,
                 hw: HardwareSpec | None = None, kernel_seconds=None):
        self.hw, self.kernel_seconds = hw, kernel_seconds
        self.prop = prop
        self.sg = prop.sharded
        self.g = prop.sharded.graph
        self.plan = plan
        self.mesh = mesh
        self.sizes = Sizes(prop, dims, plan)
        self._canonical: dict[str, str] = {}
        self.group_keys: set[str] = set()
        self._costs: dict[Op, tuple[int, int, int]] = {}
        self._kernels: dict[Op, Kernel] = {}
        self._layout_keys: dict[int, tuple[dict, tuple]] = {}
        self._chunk_ops: dict[tuple[int, int], tuple[list[Op], list[Op]]] = {}
        self._emissions: dict[Op, tuple] = {}
        self._gathers: dict[int, dict] = {}
        self._gather_bytes: dict[tuple, int] = {}  # (parameter, gathered layout key) -> bytes of its shard
        self.fwd_ops = [op for op in prop.ops if op.phase == FORWARD]
        self.bwd_ops = [op for op in prop.ops if op.phase == BACKWARD]
        self.recompute_set = self._recompute_ops()
        self.stages, self.virtual = self.sg.pipeline
        self.chunks = self.stages * self.virtual
        self.schedule = schedule
        self.placement = getattr(schedule, "placement", "loop")  # which chunks a stage holds (schedule.steps)
        self.local = self.virtual * copies(self.placement)  # the chunks a stage runs (DualPipe: two copies)
        self.producer = {t: op for op in prop.ops for t in op.outputs}
        self.params = set(self.g.params)
        self.chunk = self.assign_chunks()
        self.crossings = self.find_crossings()

    # ------------------------------------------------------------------ recompute
    def _recompute_ops(self) -> set[Op]:
        mode = self.sg.recompute
        if mode == "full":
            return {op for op in self.fwd_ops if op.layer is not None}
        if mode == "selective":
            return {op for op in self.fwd_ops if op.block == "attn_core"}
        return set()

    def _region_key(self, op: Op):
        return (op.layer, "layer") if self.sg.recompute == "full" else (op.layer, op.block)

    # ------------------------------------------------------------------ numbers
    def cost(self, op: Op) -> tuple[int, int, int]:
        got = self._costs.get(op)
        if got is None:
            got = _cost(op, self.sizes.local_letters(op, self.prop.plan(op)))
            self._costs[op] = got
        return got

    def kernel(self, op: Op) -> Kernel:
        """What a compute model needs of ``op`` on this rank (one object per op)."""
        got = self._kernels.get(op)
        if got is None:
            mm, other, nbytes = self.cost(op)
            dtype = (op.inputs or op.outputs)[0].dtype
            got = kernel(op.kind, op.fn, op.phase, op.spec, self.sizes.local_letters(op, self.prop.plan(op)),
                         dtype, flops=mm + other, matmul_flops=mm, nbytes=nbytes, causal=bool(op.attrs.get("causal")))
            self._kernels[op] = got
        return got

    def comm_size(self, r: Redistribute) -> int:
        # ASTRA-sim's comm_size: all-reduce and all-to-all the full buffer per rank,
        # reduce-scatter the full input per rank, all-gather the per-rank input shard:
        # in every case the bytes of the tensor as it is before the collective.
        return self.sizes.nbytes(r.tensor, r.before)

    def group_size(self, key: str) -> int:
        """Ranks in a group of ``key`` (memoised: every collective asks)."""
        sizes = self.__dict__.setdefault("_group_sizes", {})
        n = sizes.get(key)
        if n is None:
            n = sizes[key] = self.mesh.group_size(key)
        return n

    def key(self, axis: str) -> str:
        """The group key to name: an expert-view key that spans the same ranks as a
        decoder key (ep = cp in some orders, etp = tp by default) names that key's groups."""
        key = self._canonical.get(axis)
        if key is None:
            key = self._canonical[axis] = self.mesh.canonical(axis)
        self.group_keys.add(key)
        return key

    def lk(self, layout: dict) -> tuple:
        """layout_key, memoised on the (long-lived) layout dicts of the op plans."""
        got = self._layout_keys.get(id(layout))
        if got is None or got[0] is not layout:
            got = (layout, layout_key(layout))
            self._layout_keys[id(layout)] = got
        return got[1]

    # ------------------------------------------------------------------ emission
    def _emission(self, op: Op) -> tuple:
        """What emitting ``op`` reads of its plan, worked out once per op (emission repeats
        every op per micro-batch): its redistributions as (tensor, key before, key after,
        collective or None, bytes, group key, node-name suffix), the layout keys of its
        inputs and outputs."""
        got = self._emissions.get(op)
        if got is None:
            plan = self.prop.plan(op)

            def moves(rs, with_tensor: bool):
                return tuple(
                    (r.tensor, self.lk(r.before), self.lk(r.after), r.kind,
                     self.comm_size(r) if r.kind is not None else 0, self.key(r.axis) if r.kind is not None else "",
                     f":{COMM_KEYS[r.kind]}.{r.axis}" + (f":{r.tensor.name}" if with_tensor else "")
                     if r.kind is not None else "")
                    for r in rs if not r.param_gather)

            got = (moves(plan.pre, True), tuple((t, self.lk(layout)) for t, layout in zip(op.inputs, plan.in_layouts)),
                   tuple((t, self.lk(layout)) for t, layout in zip(op.outputs, plan.out_layouts)),
                   moves(plan.post, False))
            self._emissions[op] = got
        return got

    def emit_op(self, prog: _Program, op: Op, versions: dict, tag: str, gathers: dict, phase: str) -> None:
        plan = self.prop.plan(op)
        if op.layer in gathers:
            where = f"layer{op.layer}" if op.layer is not None else "outside_layers"
            self.emit_param_gathers(prog, gathers.pop(op.layer), versions, f"{tag}.{where}")
        pre, in_keys, out_keys, post = self._emission(op)

        def deps_of(t: Tensor, layout: dict) -> tuple[int, ...]:
            return versions.get((t, self.lk(layout)), versions.get((t, None), ()))

        for t, before, after, kind, size, group, suffix in pre:
            src = versions.get((t, before), versions.get((t, None), ()))
            if kind is None:
                versions[(t, after)] = src
                continue
            versions[(t, after)] = (prog.coll(f"{tag}.{op.name}{suffix}", kind, size, group, src),)

        deps: list[int] = []
        for key in in_keys:
            deps.extend(versions.get(key, versions.get((key[0], None), ())))
        matmul_before = prog.flops["matmul"]
        if op.kind == "view":
            out_deps = tuple(sorted(set(deps)))
        elif plan.ring is not None:
            out_deps = self.emit_ring(prog, op, plan, deps, deps_of, tag)
        else:
            for kc in plan.kernel_comms:
                if kc.before:
                    deps = [self.emit_kernel_comm(prog, op, plan, kc, tag, deps)]
            mm, other, nbytes = self.cost(op)
            last = prog.comp(f"{tag}.{op.name}", mm, other, nbytes, deps, self.kernel(op))
            for kc in plan.kernel_comms:
                if not kc.before:
                    last = self.emit_kernel_comm(prog, op, plan, kc, tag, [last])
            out_deps = (last,)
        if phase == FORWARD:  # Megatron's model FLOPs: forward and backward matmuls, 3x the forward's
            prog.model_flops += self.model_flops_per_forward * (prog.flops["matmul"] - matmul_before)
        for key in out_keys:
            versions[key] = out_deps
            versions[(key[0], None)] = out_deps
        for t, before, after, kind, size, group, suffix in post:
            src = versions.get((t, before), versions.get((t, None), ()))
            moved = src if kind is None else (prog.coll(f"{tag}.{op.name}{suffix}", kind, size, group, src),)
            versions[(t, after)] = moved
            versions[(t, None)] = moved

    def emit_ring(self, prog: _Program, op: Op, plan: OpPlan, deps: list[int], deps_of, tag: str) -> tuple:
        """A kernel that streams the shards of its ring letter around the axis (ring
        attention, as TransformerEngine's): one block per rank of the ring, each computed
        while the next block travels.  Forward passes the local K/V block on cp-1 times;
        backward passes K/V, then K/V with the dK/dV gathered so far, then dK/dV, the
        other way round: cp messages, 2(cp-1) blocks of K/V bytes.  Every step computes
        1/cp of the kernel (with load-balanced chunks, causal steps weigh the same).
        Returns the deps of the kernel's outputs."""
        axis, letter = plan.ring
        ins, outs = parse_spec(op.spec)
        streamed = [(t, layout) for t, layout, term in zip(op.inputs, plan.in_layouts, ins) if letter in term]
        kv = sum(self.sizes.nbytes(t, layout) for t, layout in streamed)
        grads = [(t, layout) for t, layout, term in zip(op.outputs, plan.out_layouts, outs) if letter in term]
        dkv = sum(self.sizes.nbytes(t, layout) for t, layout in grads)
        kv_deps = tuple(d for t, layout in streamed for d in deps_of(t, layout))
        mm, other, nbytes = self.cost(op)
        n = self.sizes.deg([axis])
        backward = bool(grads)
        to, frm = (f"{axis}%-1", f"{axis}%+1") if backward else (f"{axis}%+1", f"{axis}%-1")
        name = f"{tag}.{op.name}"
        recv = comp = None
        for i in range(n):
            step_recv = None
            if backward or i < n - 1:
                if backward:
                    size, send_deps = (kv, kv_deps) if i == 0 else (dkv if i == n - 1 else kv + dkv, (recv, comp))
                else:
                    size, send_deps = kv, kv_deps if i == 0 else (recv,)
                ring_tag = prog.next_tag()
                step_recv = prog.p2p(f"{name}:ring{i}:recv", NodeType.COMM_RECV, size, frm, ring_tag, ())
                prog.p2p(f"{name}:ring{i}:send", NodeType.COMM_SEND, size, to, ring_tag, send_deps)
            comp = prog.comp(f"{name}:ring{i}", mm, other, nbytes, deps if i == 0 else (comp, recv),
                             self.kernel(op))
            recv = step_recv
        return (comp, recv) if backward else (comp,)

    def emit_kernel_comm(self, prog: _Program, op: Op, plan: OpPlan, kc, tag: str, deps) -> int:
        letters = self.sizes.local_letters(op, plan)
        size = kc.per
        for c in kc.letters:
            size *= letters[c]
        for c in kc.whole:
            size *= self.sizes.value[op.letter_sizes[c]]
        return prog.coll(f"{tag}.{op.name}:{COMM_KEYS[kc.kind]}.{kc.key}", kc.kind, _whole(size, op.name),
                         self.key(kc.key), deps)

    def emit_param_gathers(self, prog: _Program, gathers, versions: dict, name: str):
        """FSDP: one all-gather of a layer's parameters per group, before the layer runs."""
        for key, size, gathered in gathers:
            # background: prefetched one layer ahead (released by the previous layer's gather)
            release = prog.last_gather if prog.last_gather is not None else -1
            nid = prog.coll(f"{name}:all_gather.{key}:params", CollectiveType.ALL_GATHER, size, self.key(key), (),
                            release=release, group_size=self.mesh.group_size(key))
            prog.last_gather = nid
            for t, layout_key_ in gathered:
                versions[(t, layout_key_)] = (nid,)
                if self.sg.keep_gathered:
                    prog.gathered[(t, layout_key_)] = (nid,)

    def step_gathers(self, prog: _Program, chunk: int, versions: dict) -> dict:
        """The gathers a step of ``chunk`` emits (:meth:`layer_gathers`).  Parameters kept
        gathered (``keep_gathered``: FSDP without resharding) are gathered at their first
        use in the step only: later steps read the kept copies (``versions`` gets them)."""
        gathers = self.layer_gathers(chunk)
        if not self.sg.keep_gathered:
            return gathers
        versions.update(prog.gathered)
        out = {}
        for layer, units in gathers.items():
            left = []
            for key, _, tensors in units:
                todo = [(t, k) for t, k in tensors if (t, k) not in prog.gathered]
                if todo:
                    left.append((key, sum(self._gather_bytes[(t, k)] for t, k in todo), todo))
            if left:
                out[layer] = left
        return out

    def layer_gathers(self, chunk: int) -> dict:
        """FSDP units of a chunk: per layer (None = outside the layers), the all-gathers of
        the parameters its forward uses, as (group key, bytes, [(tensor, layout key)]);
        the same unit is gathered again for backward.  A parameter sharded over several
        axes (dp and cp) is gathered over them at once."""
        got = self._gathers.get(chunk)
        if got is not None:
            return dict(got)
        steps: dict = {}
        for op in self.chunk_ops(self.fwd_ops, chunk):
            for t in op.inputs:
                # propagation plans a parameter's gather once, at its first reader; a parameter
                # read in other chunks too (a tied embedding's head) is gathered in each
                if t in self.param_gathers and all(t not in unit for unit in steps.values()):
                    steps.setdefault(op.layer, {})[t] = list(self.param_gathers[t])
        got = {}
        for layer, by_tensor in steps.items():
            by_key: dict[str, list[list[Redistribute]]] = {}
            for rs in by_tensor.values():
                by_key.setdefault(self.mesh.key(r.axis for r in rs), []).append(rs)
            for rs in by_tensor.values():
                self._gather_bytes[(rs[0].tensor, self.lk(rs[-1].after))] = self.sizes.nbytes(rs[0].tensor,
                                                                                              rs[0].before)
            if self.sg.gather_unit == "parameter":  # one all-gather per parameter tensor
                got[layer] = [(key, self._gather_bytes[(rs[0].tensor, self.lk(rs[-1].after))],
                               [(rs[0].tensor, self.lk(rs[-1].after))])
                              for key, tensors in by_key.items() for rs in tensors]
                continue
            got[layer] = [(key, sum(self._gather_bytes[(rs[0].tensor, self.lk(rs[-1].after))] for rs in tensors),
                           [(rs[0].tensor, self.lk(rs[-1].after)) for rs in tensors])
                          for key, tensors in by_key.items()]
        self._gathers[chunk] = got
        return dict(got)

    @cached_property
    def param_gathers(self) -> dict[Tensor, list[Redistribute]]:
        """Per parameter stored sharded (ZeRO-3), the gathers that make its compute layout,
        one per axis, from the forward op propagation planned them at."""
        out: dict[Tensor, list[Redistribute]] = {}
        for op in self.fwd_ops:
            for r in self.prop.plan(op).pre:
                if r.param_gather:
                    lst = out.setdefault(r.tensor, [])
                    if all(x.axis != r.axis for x in lst):
                        lst.append(r)
        return out

    # ------------------------------------------------------------------ pipeline chunks
    @cached_property
    def layers(self) -> list[int]:
        return list(dict.fromkeys(op.layer for op in self.fwd_ops if op.layer is not None))

    @cached_property
    def stage_layers(self) -> tuple[int, ...]:
        """Layers per chunk, in chunk order: the strategies' split, or an even one."""
        n, layers = self.chunks, len(self.layers)
        counts = self.sg.stage_layers
        if counts is None:
            if layers % n:
                raise UsageError(f"--pp {self.stages} x --virtual-stages {self.virtual}: {layers} layers do not "
                                 f"split into {n} equal chunks; give --stage-layers")
            counts = (layers // n,) * n
        if len(counts) != n or sum(counts) != layers:
            raise UsageError(f"--stage-layers {','.join(map(str, counts))}: needs {n} counts summing to {layers}")
        return tuple(counts)

    def assign_chunks(self) -> dict[Op, int | None]:
        """The chunk (stage x virtual stage) of every op: layers split in order by
        :attr:`stage_layers`; what runs before the first layer goes with the first chunk,
        what runs after the last with the last.  A backward op runs where its forward op
        runs; a gradient sum whose parts come from several chunks (a tied embedding) gets
        None: each chunk sums its own parts."""
        n = self.chunks
        layer_chunk = {}
        for c, count in enumerate(self.stage_layers):
            for layer in self.layers[len(layer_chunk):len(layer_chunk) + count]:
                layer_chunk[layer] = c
        first = next((i for i, op in enumerate(self.fwd_ops) if op.layer is not None), len(self.fwd_ops))
        chunk: dict[Op, int | None] = {}
        for i, op in enumerate(self.fwd_ops):
            chunk[op] = layer_chunk[op.layer] if op.layer is not None else (0 if i < first else n - 1)
        for op in self.bwd_ops:
            if op.attrs.get("accumulate"):
                sources = {chunk[self.producer[t]] for t in op.inputs if t in self.producer}
                if len(sources) == 1:
                    chunk[op] = sources.pop()  # summed where its parts are made: one transfer, not several
                elif op.outputs[0].grad_of in self.params:
                    chunk[op] = None
                else:
                    chunk[op] = chunk[op.forward_op]  # some parts arrive from the next stage
            else:
                chunk[op] = chunk[op.forward_op]
        return chunk

    def stage_of(self, chunk: int, copy: int = 0) -> int:
        """The stage running ``chunk`` (for a micro-batch of ``copy``: DualPipe's direction)."""
        return stage_of(self.placement, chunk, self.stages, copy)

    def copy_of(self, local: int) -> int:
        """The copy of the model a stage's ``local`` chunk belongs to (0 but under "dual")."""
        return local // self.virtual if self.placement == "dual" else 0

    def chunk_of(self, stage: int, local: int) -> int:
        return chunk_of(self.placement, stage, local, self.stages)

    def stage_chunks(self, stage: int) -> list[int]:
        """The model chunks ``stage`` holds, by its local chunk index."""
        return [self.chunk_of(stage, local) for local in range(self.local)]

    def chunk_ops(self, ops: list[Op], c: int) -> list[Op]:
        key = (id(ops), c)
        got = self._chunk_ops.get(key)
        if got is None or got[0] is not ops:
            got = (ops, [op for op in ops
                         if self.chunk[op] == c or (self.chunk[op] is None and self.local_parts(op, c))])
            self._chunk_ops[key] = got
        return got[1]

    def local_parts(self, op: Op, c: int) -> list[Tensor]:
        return [t for t in op.inputs if t in self.producer and self.chunk[self.producer[t]] == c]

    def find_crossings(self) -> list[tuple[Tensor, int, int, str]]:
        """Tensors one chunk makes and another reads: (tensor, from, to, "F" | "B")."""
        out: dict[tuple, None] = {}
        received: set[tuple[Tensor, int]] = set()
        for phase, ops in (("F", self.fwd_ops), ("B", self.bwd_ops)):
            for op in ops:
                c = self.chunk[op]
                if c is None:
                    continue
                for t in op.inputs:
                    src = self.producer.get(t)
                    if src is None or self.chunk[src] == c:
                        continue
                    if phase == "B" and src.phase == FORWARD:
                        if (t, c) not in received:
                            raise UsageError(f"op {op.name} reads {t.name} from another pipeline stage in backward")
                        continue
                    out[(t, self.chunk[src], c, phase)] = None
                    received.add((t, c))
        return list(out)

    def message_size(self, t: Tensor) -> tuple[int, str | None]:
        """Bytes a pipeline message of ``t`` carries, and the axis the receiver gathers it over
        (None: the whole tensor is sent).  Under the graph's ``pipeline_split`` a tensor
        replicated over that axis is cut in as many slices as the axis has ranks (the last
        rounded up) and each rank sends its own."""
        layout = self.prop.produced.get(t, {})
        whole = self.sizes.nbytes(t, layout)
        axis = self.sg.pipeline_split
        degree = self.mesh.degrees.get(axis, 1) if axis else 1
        if degree < 2 or not isinstance(layout.get(axis, Replicate()), Replicate):
            return whole, None
        return -(-whole // degree), axis

    def peer_key(self, src_chunk: int, dst_chunk: int, sending: bool, copy: int = 0) -> str:
        delta = self.stage_of(dst_chunk, copy) - self.stage_of(src_chunk, copy)
        delta = delta if sending else -delta
        return f"pp{'+' if delta >= 0 else '-'}{abs(delta)}"

    # ------------------------------------------------------------------ one program per stage
    @cached_property
    def weight_ops(self) -> set[Op]:
        """Backward ops that compute weight gradients (W of a split backward, as in the
        zero-bubble paper): every output is a parameter's gradient (a matmul's weight
        gradient, a bias's reduction, the embedding's scatter, the sum of a tied weight's
        parts).  Ops on the path of the activations' gradients are B, even on the first
        stage where nothing is sent; a kernel that writes an input gradient too (a norm's
        backward, which gives dx, dgamma and dbeta at once) stays in B; a registered kernel
        may say otherwise (``KernelDef.weight``)."""
        out: set[Op] = set()
        for op in self.bwd_ops:
            declared = op.attrs.get("weight_grad")
            if declared is not None:
                if declared:
                    out.add(op)
            elif op.outputs and all(t.grad_of in self.params for t in op.outputs):
                out.add(op)
        return out

    def weight_hold(self, chunk: int) -> int:
        """Bytes a split backward keeps from its B to its W in ``chunk``: what the W ops read
        that they do not make (the inputs of the weight-gradient matmuls and the output
        gradients B made), as produced."""
        held: dict[Tensor, dict] = {}
        w = self.weight_ops
        for op in self.chunk_ops(self.bwd_ops, chunk):
            if op not in w:
                continue
            for t in op.inputs:
                if t.role in (Role.ACTIVATION, Role.GRADIENT) and self.producer.get(t) not in w:
                    held[t] = self.prop.kept.get(t, self.prop.produced.get(t, {}))
        return sum(self.sizes.nbytes(t, layout) for t, layout in held.items())

    def expected_emissions(self, op: Op, stage: int, visits: dict[int, int]) -> int:
        """How many times ``op`` runs on ``stage`` in a step: once per micro-batch running its
        chunk there (``visits``: model chunk -> micro-batches; every micro-batch, but under
        "dual" those of the copy's direction), and a sum whose parts live on several chunks
        once per such micro-batch of each chunk of the stage holding parts."""
        if self.chunk[op] is not None:
            return visits.get(self.chunk[op], 0)
        return sum(visits.get(c, 0) for c in self.stage_chunks(stage) if self.local_parts(op, c))

    # ------------------------------------------------------------------ one program per stage
    def program(self, stage: int) -> tuple[_Program, int]:
        """The program of pipeline stage ``stage`` and its peak activation bytes."""
        prog = _Program(self.group_size)
        m_total = self.plan.micro_batches
        prog.tags = m_total * len(self.crossings)  # pipeline tags come first; kernels' own messages follow
        order = self.schedule(self.stages, m_total, self.virtual)[stage]
        split = {(m, lc) for kind, m, lc in flat_steps(order) if kind == "W"}
        visits: dict[int, int] = {}  # model chunk -> the micro-batches that run it on this stage
        for kind, m, lc in flat_steps(order):
            if kind == "F":
                c = self.chunk_of(stage, lc)
                visits[c] = visits.get(c, 0) + 1
        buckets = self.plan_buckets(stage)
        # a bucket is reduced as soon as its last gradient is final: after the last run of every op making one
        pending = [{self.producer[self.g.grads[p]] for p in bucket} for bucket, _, _ in buckets]
        by_producer: dict[Op, list[int]] = {}
        for i, ops in enumerate(pending):
            for op in ops:
                by_producer.setdefault(op, []).append(i)
        runs: dict[Op, int] = {}
        syncs: dict[int, list[int]] = {}
        per_mb: dict[int, dict] = {}
        index = {x: i for i, x in enumerate(self.crossings)}
        chunk_acts = prog.chunk_acts
        held = prog.chunk_hold
        live = peak = 0
        weight = self.weight_ops

        def emit_backward(op: Op, c: int, versions: dict, tag: str, gathers: dict) -> None:
            if self.chunk[op] is None:
                self.emit_partial_sum(prog, op, c, versions, f"{tag}.bwd")
            else:
                self.emit_op(prog, op, versions, f"{tag}.bwd", gathers, BACKWARD)
            if op in by_producer:
                runs[op] = runs.get(op, 0) + 1
                if runs[op] == self.expected_emissions(op, stage, visits):
                    for i in by_producer[op]:
                        pending[i].discard(op)
                        if not pending[i]:
                            syncs[i] = self.emit_bucket_sync(prog, i, buckets[i][0], buckets[i][2], versions,
                                                             stage)

        def runs_of(ops: list[Op]) -> list[list[Op]]:
            """``ops`` cut where the layer changes: the units an overlapped pair interleaves."""
            out: list[list[Op]] = []
            for op in ops:
                if out and out[-1][-1].layer == op.layer:
                    out[-1].append(op)
                else:
                    out.append([op])
            return out

        def forward_units(m: int, c: int, versions: dict, tag: str) -> list:
            gathers = self.step_gathers(prog, c, versions)

            def unit(ops):
                return lambda: [self.emit_op(prog, op, versions, f"{tag}.fwd", gathers, FORWARD) for op in ops]

            return [unit(ops) for ops in runs_of(self.chunk_ops(self.fwd_ops, c))]

        def backward_units(m: int, c: int, versions: dict, tag: str, kind: str, splitting: bool) -> list:
            gathers = self.step_gathers(prog, c, versions)  # gathered again for backward (unless kept)
            recomputed: set = set()
            if kind == "W":  # the weight gradients of a split backward (recomputed inputs were kept since B)
                ops = [op for op in self.chunk_ops(self.bwd_ops, c) if op in weight]
                return [lambda ops=ops: [emit_backward(op, c, versions, tag + ".w", gathers) for op in ops]]
            ops = [op for op in self.chunk_ops(self.bwd_ops, c) if not (splitting and op in weight)]

            def emit(op):
                fwd = op.forward_op
                if fwd is not None and fwd in self.recompute_set:
                    region = self._region_key(fwd)
                    if region not in recomputed:
                        recomputed.add(region)
                        # recompute runs when the backward reaches the region (as Megatron's
                        # checkpointed forward does), not as soon as its saved inputs exist
                        prog.not_before = prog.step_last if prog.step_last is not None else prog.step_tail
                        for f in self.chunk_ops(self.fwd_ops, c):
                            if f in self.recompute_set and self._region_key(f) == region:
                                self.emit_op(prog, f, versions, f"{tag}.recompute", gathers, BACKWARD)
                        prog.not_before = None
                emit_backward(op, c, versions, tag, gathers)

            return [lambda run=run: [emit(op) for op in run] for run in runs_of(ops)]

        for step in order:
            parts = list(step) if is_pair(step) else [step]
            units = []
            for kind, m, local_chunk in parts:
                c = self.chunk_of(stage, local_chunk)
                copy = self.copy_of(local_chunk)
                versions = per_mb.setdefault(m, {})
                tag = f"mb{m}" + (f".chunk{c}" if self.chunks > 1 else "")
                for x in self.crossings:  # (W has no pipeline messages: B sends the input gradient)
                    t, src, dst, ph = x
                    if dst == c and ph == kind and self.stage_of(src, copy) != stage:  # (a V's turn stays on the stage)
                        size, gather_axis = self.message_size(t)
                        name = f"{tag}.{'fwd' if ph == 'F' else 'bwd'}"
                        rid = prog.p2p(f"{name}:recv:{t.name}", NodeType.COMM_RECV, size,
                                       self.peer_key(src, dst, False, copy), 1 + m * len(self.crossings) + index[x], ())
                        if gather_axis:  # the slices of the axis's ranks gathered back into the whole tensor
                            rid = prog.coll(f"{name}:gather:{t.name}", CollectiveType.ALL_GATHER, size,
                                            self.key(gather_axis), (rid,))
                        versions[(t, self.lk(self.prop.produced.get(t, {})))] = (rid,)
                        versions[(t, None)] = (rid,)
                if kind == "F":
                    units.append(forward_units(m, c, versions, tag))
                else:
                    units.append(backward_units(m, c, versions, tag, kind, (m, local_chunk) in split))
            if len(units) == 1:
                for emit_unit in units[0]:
                    emit_unit()
            else:  # an overlapped pair: the forward's layers and the backward's, one after the other
                for i in range(max(map(len, units))):
                    for us in units:
                        if i < len(us):
                            us[i]()
            for kind, m, local_chunk in parts:
                c = self.chunk_of(stage, local_chunk)
                copy = self.copy_of(local_chunk)
                versions = per_mb[m]
                tag = f"mb{m}" + (f".chunk{c}" if self.chunks > 1 else "")
                if kind == "F":
                    if c not in chunk_acts:
                        chunk_acts[c] = self.activation_bytes(c)
                    live += chunk_acts[c]
                    peak = max(peak, live)
                elif kind == "B":
                    live -= chunk_acts.get(c, 0)
                    if (m, local_chunk) in split:
                        if c not in held:
                            held[c] = self.weight_hold(c)
                        live += held[c]
                        peak = max(peak, live)
                else:
                    live -= held.get(c, 0)
                for x in self.crossings:
                    t, src, dst, ph = x
                    if src == c and ph == kind and self.stage_of(dst, copy) != stage:
                        deps = versions.get((t, self.lk(self.prop.produced.get(t, {}))), versions.get((t, None), ()))
                        prog.p2p(f"{tag}.{'fwd' if ph == 'F' else 'bwd'}:send:{t.name}", NodeType.COMM_SEND,
                                 self.message_size(t)[0], self.peer_key(src, dst, True, copy),
                                 1 + m * len(self.crossings) + index[x], deps)
            prog.end_step(parts[0][1])
        unsynced = [i for i, ops in enumerate(pending) if ops]
        if unsynced:  # every gradient's maker runs on this stage: a bucket left means lowering lost one
            raise RuntimeError(f"stage {stage}: gradient buckets {unsynced} never completed "
                               f"({sorted(op.name for op in pending[unsynced[0]])[:3]} did not run every micro-batch)")
        self.emit_optimizer(prog, stage, buckets, syncs, per_mb.get(m_total - 1, {}))
        prog.finish(self.timing(stage))
        return prog, peak

    def timing(self, stage: int) -> Timing | None:
        if self.hw is None or self.kernel_seconds is None:
            return None
        first = min(r for r in range(self.mesh.world_size) if self.mesh.coord(r, "pp") == stage)
        return Timing(self.hw, self.kernel_seconds, self.mesh, first)

    def emit_partial_sum(self, prog: _Program, op: Op, c: int, versions: dict, tag: str) -> None:
        """This chunk's part of a gradient sum whose parts live on several stages."""
        parts = self.local_parts(op, c)
        deps = [d for t in parts for d in versions.get((t, None), ())]
        if len(parts) > 1:
            numel = self.sizes.numel(op.outputs[0], self.prop.plan(op).out_layouts[0])
            flops, nbytes = (len(parts) - 1) * numel, (len(parts) + 1) * numel * op.outputs[0].itemsize
            summed = kernel("elementwise", "add", op.phase, "n->n", {"n": numel}, op.outputs[0].dtype,
                            flops=flops, matmul_flops=0, nbytes=nbytes)
            nid = prog.comp(f"{tag}.{op.name}", 0, flops, nbytes, deps, summed)
            deps = [nid]
        out = op.outputs[0]
        versions[(out, None)] = tuple(deps)
        versions[(out, self.lk(self.prop.plan(op).out_layouts[0]))] = tuple(deps)

    # ------------------------------------------------------------------ gradient sync and optimizer
    def bucket_size(self) -> int:
        if self.plan.bucket_params is not None:
            return self.plan.bucket_params
        # Megatron-Core DDP: max(40M, 1M * data-parallel size) parameters per bucket
        return max(40_000_000, 1_000_000 * self.plan.dp)

    def stage_params(self, stage: int) -> list[Tensor]:
        """Parameters a stage holds: those its chunks' ops use (a tied embedding: first and last)."""
        used = {t for c in self.stage_chunks(stage) for op in self.chunk_ops(self.fwd_ops, c)
                for t in op.inputs}
        return [p for p in self.g.params if p in used]

    @cached_property
    def _held(self) -> list[set[Tensor]]:
        return [set(self.stage_params(s)) for s in range(self.stages)]

    def param_stages(self, p: Tensor) -> list[int]:
        return [s for s in range(self.stages) if p in self._held[s]]

    def grad_axes(self, p: Tensor) -> tuple[str, ...]:
        """The axes ``p``'s gradient is reduced over: cp and dp, or for an expert weight the
        expert-data-parallel axis (Megatron's expert-data-parallel group).  An axis a strategy
        split (hybrid sharding's dp) counts as its parts, each reduced as its target says."""
        axes = ("edp",) if p in self.prop.expert else self.mesh.expand(("cp", "dp"))
        return tuple(a for a in axes if self.sg.active(a) and self.grad_target(a) is not None)

    def grad_target(self, axis: str):
        """What gradients reduce to over ``axis`` (a part of a split axis: its own, else its parent's)."""
        got = self.sg.grad_target.get(axis)
        if got is None:
            parent = next((a for a, split in self.mesh.atoms.items() if axis in split), None)
            got = self.sg.grad_target.get(parent) if parent is not None else None
        return got

    def plan_buckets(self, stage: int) -> list[tuple[list[Tensor], Op, tuple[str, ...]]]:
        """A stage's parameters grouped in the order their gradients become final in backward,
        one run of buckets per reduction group (expert weights apart, as in Megatron)."""
        index = {op: i for i, op in enumerate(self.bwd_ops)}
        final = {p: self.producer[self.g.grads[p]] for p in self.stage_params(stage)}
        order = sorted(final, key=lambda p: index[final[p]])
        limit = self.bucket_size()
        buckets: list = []
        open_: dict[tuple, tuple[list, int]] = {}
        for p in order:
            axes = self.grad_axes(p)
            cur, count = open_.get(axes, ([], 0))
            cur.append(p)
            count += self.sizes.numel(p, self.sg.compute_layout(p))
            open_[axes] = (cur, count)
            if count >= limit:
                buckets.append((cur, axes))
                del open_[axes]
        buckets += [(cur, axes) for axes, (cur, _) in open_.items()]
        buckets.sort(key=lambda b: index[final[b[0][-1]]])
        return [(b, final[b[-1]], axes) for b, axes in buckets]

    def emit_bucket_sync(self, prog: _Program, i: int, bucket: list[Tensor], axes: tuple[str, ...],
                         versions: dict, stage: int = 0) -> list[int]:
        """The data-parallel reduction of one bucket: all-reduce, or reduce-scatter under ZeRO;
        over axes some of which shard and some not (hybrid sharding: a shard group inside dp,
        replicated across), a reduce-scatter inside the sharding axes, then an all-reduce of
        the shard across the others.  Under DualPipe's two copies ("dual"), then the sum of
        the copies (:meth:`emit_copies_sum`)."""
        deps = [d for p in bucket for d in versions.get((self.g.grads[p], None), ())]
        if not axes:
            return self.emit_copies_sum(prog, i, bucket, deps, stage) if self.placement == "dual" else deps
        numel = sum(self.sizes.numel(p, self.sg.compute_layout(p)) for p in bucket)
        item = DTYPE_BYTES[self.plan.grad_dtype]
        sharding = [a for a in axes if isinstance(self.grad_target(a), Shard)]
        rest = [a for a in axes if a not in sharding]
        out = deps
        if sharding:
            n = self.sizes.deg(sharding)
            numel = -(-numel // n) * n  # buckets are padded to a multiple of the group size
            key = self.mesh.key(sharding)
            # background: released once the bucket's last gradient is final
            kind = CollectiveType.REDUCE_SCATTER
            out = [prog.coll(f"grad_sync.bucket{i}:{COMM_KEYS[kind]}.{key}", kind, numel * item, self.key(key), out,
                             release=-1, group_size=n)]
            numel //= n
        if rest:
            key = self.mesh.key(rest)
            kind = CollectiveType.ALL_REDUCE
            out = [prog.coll(f"grad_sync.bucket{i}:{COMM_KEYS[kind]}.{key}", kind, numel * item, self.key(key), out,
                             release=-1, group_size=self.sizes.deg(rest))]
        if self.placement == "dual":
            out = self.emit_copies_sum(prog, i, bucket, out, stage, numel)
        return out

    def emit_copies_sum(self, prog: _Program, i: int, bucket: list[Tensor], deps: list[int], stage: int,
                        numel: int | None = None) -> list[int]:
        """DualPipe's two copies: stage s holds chunk s for the micro-batches fed from the first
        stage and chunk p − 1 − s for those fed from the last, and stage p − 1 − s the same two
        chunks the other way round, so each gradient is summed over that pair of stages before
        the optimizer step (the DualPipe reference's example adds the mirror rank's gradients of
        the other copy).  Per bucket, after its data-parallel reduction, in the background as
        that reduction is: an all-reduce over the pair of what the reduction leaves on the rank
        (``numel``: the whole bucket after an all-reduce, its shard after ZeRO's reduce-scatter;
        the pair's ranks hold the same shard).  The two stages hold the same parameters and so
        the same buckets; a tied embedding's sum over the first and last stage is this one."""
        pair = self.pair_key(stage)
        if numel is None:
            numel = sum(self.sizes.numel(p, self.sg.compute_layout(p)) for p in bucket)
        kind = CollectiveType.ALL_REDUCE
        return [prog.coll(f"grad_sync.bucket{i}:{COMM_KEYS[kind]}.{pair}", kind,
                          numel * DTYPE_BYTES[self.plan.grad_dtype], self.key(pair), deps, release=-1, group_size=2)]

    def pair_key(self, stage: int) -> str:
        """The group of ``stage`` and its mirror ``pp − 1 − stage``, which hold the same chunks under "dual"."""
        return "pp@" + ",".join(map(str, sorted({stage, self.stages - 1 - stage})))

    def emit_optimizer(self, prog: _Program, stage: int, buckets, syncs: dict[int, list[int]], versions) -> None:
        sg = self.sg
        grad_item = DTYPE_BYTES[self.plan.grad_dtype]
        params = self.stage_params(stage)
        after = [d for i in sorted(syncs) for d in syncs[i]]
        # a parameter held by several stages (a tied embedding on the first and last)
        # sums its gradients over those stages, as Megatron's embedding all-reduce does
        by_group: dict[str, list[Tensor]] = {}
        for p in params:
            stages = self.param_stages(p)
            if len(stages) > 1:
                by_group.setdefault("pp@" + ",".join(map(str, stages)), []).append(p)
        if self.placement == "dual":  # every parameter is on its stage and the mirror: summed per bucket
            if set(by_group) != {self.pair_key(stage)} or len(by_group[self.pair_key(stage)]) != len(params):
                raise RuntimeError(f"stage {stage}: under placement 'dual' every parameter is held by stages "
                                   f"{self.pair_key(stage)[3:]}, not as {sorted(by_group)} say")
            by_group = {}
        for key, shared in sorted(by_group.items()):
            size = sum(self.sizes.numel(p, sg.compute_layout(p)) for p in shared) * grad_item
            after = [prog.coll(f"grad_sync.shared:all_reduce.{key}", CollectiveType.ALL_REDUCE, size,
                               self.key(key), after)]
        # gradients still Partial over tp (sequence-parallel norms and biases): one
        # coalesced all-reduce over tp after the data-parallel sync, as Megatron's
        # finalize_model_grads does; the optimizer step waits for all of it
        tp_partial = [p for p in params
                      if isinstance(self.prop.produced.get(self.g.grads[p], {}).get("tp"), Partial)]
        if tp_partial:
            size = sum(self.sizes.numel(p, sg.compute_layout(p)) for p in tp_partial) * grad_item
            after = [prog.coll("grad_sync.sequence_parallel:all_reduce.tp", CollectiveType.ALL_REDUCE, size,
                               self.key("tp"), after)]
        for i, (bucket, _, axes) in enumerate(buckets):
            opt_shard = self.sizes.deg(a for a in axes if a in sg.optimizer_sharded)
            numel = sum(self.sizes.numel(p, sg.compute_layout(p)) for p in bucket)
            local = -(-numel // opt_shard)
            state_bytes = sum(2 * DTYPE_BYTES[t.dtype] for t in self.g.opt_state[bucket[0]])
            param_item = bucket[0].itemsize
            # the step starts once every gradient is reduced
            flops, nbytes = kernels.ADAM_FLOPS * local, local * (grad_item + state_bytes + param_item)
            adam = kernel("optimizer", "adam", OPTIMIZER, "n->n", {"n": local}, self.plan.optimizer_dtype,
                          flops=flops, matmul_flops=0, nbytes=nbytes)
            nid = prog.comp(f"optimizer.bucket{i}:adam", 0, flops, nbytes, after, adam)
            replicated = not any(isinstance(sg.storage_layout(p).get(a), Shard) for p in bucket for a in axes)
            if axes and opt_shard > 1 and replicated:
                # the updated shards go back to every replica (ZeRO-1/2); sharded
                # parameters (ZeRO-3) stay sharded and are gathered where used
                key = self.mesh.key(a for a in axes if a in sg.optimizer_sharded)
                prog.coll(f"optimizer.bucket{i}:all_gather.{key}:params", CollectiveType.ALL_GATHER,
                          local * param_item, self.key(key), [nid])

    # ------------------------------------------------------------------ memory
    def memory(self, stage: int, activations: int) -> dict[str, int]:
        sg = self.sg
        held = self.stage_params(stage)
        params = sum(self.sizes.nbytes(p, sg.storage_layout(p)) for p in held)
        if sg.keep_gathered:  # the gathered copies, kept the whole step beside the shards
            params += sum(self.sizes.nbytes(p, sg.compute_layout(p)) for p in held
                          if layout_key(sg.storage_layout(p)) != layout_key(sg.compute_layout(p)))
        grads = optimizer = 0
        grad_item = DTYPE_BYTES[self.plan.grad_dtype]
        for p in held:
            axes = self.grad_axes(p)
            layout = dict(sg.compute_layout(p))
            layout.update({a: Shard(FLAT) for a in axes if a in sg.grad_storage_sharded})
            grads += self.sizes.numel(self.g.grads[p], layout) * grad_item
            layout = dict(sg.compute_layout(p))
            layout.update({a: Shard(FLAT) for a in axes if a in sg.optimizer_sharded})
            for t in self.g.opt_state[p]:
                optimizer += self.sizes.nbytes(t, layout)
        return {"parameters": params, "gradients": grads, "optimizer": optimizer, "activations": activations,
                "total": params + grads + optimizer + activations}

    def saved_tensors(self, chunk: int) -> dict[Tensor, dict]:
        """Activations one micro-batch keeps for backward in ``chunk`` (as produced),
        excluding what recompute redoes.

        A tensor made inside a recomputed region is dropped when only ops inside
        the region keep it; the region's outputs that later ops keep (the attention
        core's output, a layer's output) stay.
        """
        def region(op):
            return self._region_key(op) if op in self.recompute_set else None

        made_in = {t: region(op) for op in self.fwd_ops for t in op.outputs}
        kept_elsewhere = {t for op in self.fwd_ops for t in op.saved
                          if made_in.get(t) is None or region(op) != made_in[t]}
        out: dict[Tensor, dict] = {}
        for op in self.chunk_ops(self.fwd_ops, chunk):
            for t in op.saved:
                if t.role is Role.ACTIVATION and t in kept_elsewhere:
                    out[t] = self.prop.kept.get(t, self.prop.produced.get(t, {}))
        return out

    def activation_bytes(self, chunk: int) -> int:
        return sum(self.sizes.nbytes(t, layout) for t, layout in self.saved_tensors(chunk).items())

    # ------------------------------------------------------------------ all
    def run(self) -> Lowered:
        programs, reports = [], []
        stages = self.mesh.coord_array(np.arange(self.mesh.world_size), "pp")
        for stage in range(self.stages):
            prog, peak = self.program(stage)
            ranks = tuple(np.flatnonzero(stages == stage).tolist())
            flops = dict(prog.flops)
            flops["total"] = flops["matmul"] + flops["other"]
            flops["model"] = prog.model_flops
            reports.append(ClassReport(ranks, flops, self.memory(stage, peak), dict(prog.comm), nodes=len(prog.nodes),
                                       kernel_bytes=prog.kernel_bytes, steps=prog.steps,
                                       chunk_activations=dict(prog.chunk_acts), chunk_hold=dict(prog.chunk_hold),
                                       wire_bytes=dict(prog.wire)))
            programs.append(RankProgram(ranks, tuple(prog.nodes), label=f"stage{stage}"))
        return Lowered(programs, reports, set(self.group_keys), self.stage_layers)


def lower(prop: Propagation, plan: Plan, mesh: Mesh, dims: dict[str, int], schedule=None,
          hw: HardwareSpec | None = None, kernel_seconds=None) -> Lowered:
    """Programs and reports per rank class; ``schedule(stages, micro_batches, virtual)`` orders
    each pipeline stage's steps (default 1F1B).  With ``hw`` and ``kernel_seconds(kernel)``
    background communication is cut to fit the compute between foreground
    communication (:mod:`.overlap`)."""
    return Lowerer(prop, plan, mesh, dims, schedule or one_f_one_b, hw, kernel_seconds).run()
