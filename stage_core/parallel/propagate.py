"""Sharding propagation: from declared placements to every op's layouts and collectives.

Per mesh axis, each op's inputs arrive as Replicate, Partial or Shard on one of
the op's index letters.  The rules (WORKED-EXAMPLES.md):

1. Partial inputs: an op that is a sum of its inputs (``partial_ok``) passes
   all-Partial inputs through; with two or more Partial inputs its Replicate
   inputs join them as Partial (free: one rank keeps the value), so the partial
   sums that meet at one tensor are added on the rank and reduced once (the
   gradient of SwiGLU's input from its gate and up projections, as Megatron's
   fused fc1).  Where Sharded inputs meet two or more Partial ones, the Partial
   ones are first summed by an op of their own (``Propagation.ops`` holds it).
   Otherwise each Partial input is reduced first:
   to Shard on the letter the op's output wants (a hint), or that another input is
   sharded on, by reduce-scatter; else to Replicate, by all-reduce.
2. Different letters sharded on one axis: parameters keep theirs (they are
   pinned to their compute placement), then the output's hint decides, then the
   first input.  The other inputs move: to Shard on the kept letter by all-to-all
   if they have it, else to Replicate by all-gather.
3. Replicated inputs that have the kept letter are sliced locally (free).
4. A kept letter the op needs whole (normalised, softmaxed over) is gathered,
   unless the kernel declares how it works sharded (vocabulary-parallel
   cross-entropy all-reduces three small tensors).
5. Outputs: Shard where the kept letter appears; Partial where the op sums over
   it (``linear_reduce``); a letter only in an output follows the output's hint.

Three declarations of a ShardedGraph refine rules 2-5 on an axis (context parallel
uses them): ``prefer`` names the dims whose letter ops of a block keep sharded when
their inputs disagree (attention's heads, the sequence elsewhere: all-to-alls);
``rings`` lets a kernel that declares a ring letter (``attrs["ring_letter"]``,
ring attention's keys) keep its inputs sharded on it, its outputs with that letter
sharded too, and lowering writes the ring's sends and receives; on the axes in
``reuse_forward`` backward reads a tensor as forward moved it instead of moving it
again (the kernel kept it for backward).

Outputs then move to their hint (a tagged activation's wanted placement, or for
an activation's gradient the placement of that activation) right after the op,
except that a Partial output whose every reader is a sum stays Partial (rule 1
reduces the sum once).
Expert layers run in a second view of the same ranks (Megatron-Core's expert
groups): the tensors between a MoE dispatch and its combine, the experts' weights
and their gradients have placements on the axes ``etp``, ``ep`` and ``edp``; every
other tensor on ``tp``, ``cp``, ``dp``.  The dispatch and combine kernels (and their
backward) move tokens from one view to the other (:mod:`.moe`).

Gradients of parameters stay Partial until the gradient sync after the last
micro-batch.  A redistribution is reused by later ops of the same phase; backward
redoes a gather forward did (Megatron re-gathers the sequence-parallel input of a
column-parallel linear for its weight gradient instead of keeping it) but not a
reduction: the reduced tensor is what the forward op kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import sym
from ..ir.graph import Graph
from ..ir.ops import FORWARD, OPTIMIZER, OTHER, Op, parse_spec
from ..ir.tensor import Role, Tensor
from ..trace import CollectiveType
from .mesh import EXPERT_AXES, RANK_AXES
from . import moe
from .placement import P, Partial, Replicate, Shard, ShardedGraph, dim_position, layout_key, transition_kind


@dataclass
class Redistribute:
    """One collective (or free local slice) on one axis, turning ``before`` into ``after``."""

    tensor: Tensor
    axis: str
    kind: CollectiveType | None
    before: dict
    after: dict
    param_gather: bool = False


@dataclass(frozen=True)
class KernelComm:
    """A collective a kernel runs itself, on group ``key``: ``per`` bytes times the
    product of the op's local sizes of ``letters`` and whole sizes of ``whole``;
    ``before`` the kernel or after."""

    kind: CollectiveType
    key: str
    letters: str
    per: int
    before: bool = False
    whole: str = ""


@dataclass
class OpPlan:
    op: Op
    pre: list[Redistribute] = field(default_factory=list)
    post: list[Redistribute] = field(default_factory=list)
    in_layouts: list[dict] = field(default_factory=list)
    out_layouts: list[dict] = field(default_factory=list)
    letter_axes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    kernel_comms: list[KernelComm] = field(default_factory=list)
    ring: tuple[str, str] | None = None  # (axis, letter): the kernel streams that letter's shards around the axis


@dataclass
class Propagation:
    """Every op's plan.  ``ops`` is the graph's op list as lowering runs it: the
    graph's own ops, with a sum whose Partial inputs meet Sharded ones split in two."""

    sharded: ShardedGraph
    axes: list[str]
    plans: dict[Op, OpPlan]
    produced: dict[Tensor, dict]
    ops: list[Op]
    expert: frozenset = frozenset()  # tensors placed in the expert view
    kept: dict[Tensor, dict] = field(default_factory=dict)  # activations kept reduced for backward

    def plan(self, op: Op) -> OpPlan:
        return self.plans[op]


class PropagationError(ValueError):
    pass


def _letter(layout: dict, axis: str, term: str):
    """Letter form of a tensor's placement on one axis: None (R), 'P', or the sharded letter."""
    p = layout.get(axis)
    if p is None or isinstance(p, Replicate):
        return None
    if isinstance(p, Partial):
        return "P"
    if isinstance(p, Shard) and isinstance(p.dim, int):
        return term[p.dim]
    raise PropagationError(f"placement {p} cannot be read by an op (flat shards are gathered first)")


def _placement(letter, term: str):
    if letter is None:
        return None
    if letter == "P":
        return P
    return Shard(term.index(letter))


def _set(layout: dict, axis: str, placement) -> dict:
    out = dict(layout)
    if placement is None or isinstance(placement, Replicate):
        out.pop(axis, None)
    else:
        out[axis] = placement
    return out


class _Propagator:
    def __init__(self, sg: ShardedGraph):
        self.sg = sg
        self.g: Graph = sg.graph
        # the rank axes, then the parts strategies carved out of them (hybrid sharding's shard group)
        parts = [x for inner, _, outer in getattr(sg.degrees, "parts", {}).values() for x in (inner, outer)]
        self.axes = [a for a in (*RANK_AXES, *parts) if sg.active(a)]
        self.expert_axes = [a for a in EXPERT_AXES if sg.active(a)]
        self.params = set(self.g.params)
        self.expert = moe.expert_tensors(self.g)
        self.reduced_in_forward: set[tuple[Tensor, tuple]] = set()
        self.kept: dict[Tensor, dict] = {}
        self.produced: dict[Tensor, dict] = {}
        self.avail: dict[tuple[Tensor, str], set] = {}
        self.plans: dict[Op, OpPlan] = {}
        self.readers: dict[Tensor, list[Op]] = {}
        for op in self.g.ops:
            if op.phase != OPTIMIZER:
                for t in op.inputs:
                    self.readers.setdefault(t, []).append(op)

    def axes_of(self, t: Tensor) -> list[str]:
        """The mesh axes ``t`` has placements on: the expert view's or the others'."""
        return self.expert_axes if t in self.expert else self.axes

    # ------------------------------------------------------------------ layouts of leaves
    def start_layout(self, t: Tensor) -> dict:
        if t in self.produced:
            return self.produced[t]
        if t in self.params:
            return dict(self.sg.storage_layout(t))
        if t.role is Role.GRADIENT and t.grad_of is not None and t.grad_of in self.produced:
            # the loss gradient fed to backward: the loss's layout, a Partial sum's (a mean over the
            # sharded batch) the same on every rank
            return {a: p for a, p in self.produced[t.grad_of].items() if not isinstance(p, Partial)}
        return dict(self.sg.input_layout.get(t, {}))

    def hint(self, t: Tensor) -> dict | None:
        """The layout an output should have, on the axes it names (Replicate explicit)."""
        if t.role is Role.GRADIENT and t.grad_of is not None:
            if t.grad_of in self.params:
                layout = self.sg.compute_layout(t.grad_of)
            else:
                layout = self.produced.get(t.grad_of)
                if layout is None:
                    return None
            # the gradient of a Partial sum is the same for every term: Replicate
            return {a: (p if p is not None and not isinstance(p, Partial) else Replicate())
                    for a in self.axes_of(t) for p in [layout.get(a)]}
        out = None
        for tag in sorted(t.tags):
            for axis, placement in self.sg.tag_hints.get(tag, {}).items():
                if isinstance(placement, Shard):
                    pos = dim_position(t, placement.dim)
                    if pos is None:
                        continue
                    placement = Shard(pos)
                out = dict(out or {})
                out[axis] = placement
        return out

    def is_param_grad(self, t: Tensor) -> bool:
        return t.role is Role.GRADIENT and t.grad_of is not None and t.grad_of in self.params

    # ------------------------------------------------------------------ one op
    def run(self) -> Propagation:
        ops = []
        for op in self.g.ops:
            if op.phase == OPTIMIZER:
                ops.append(op)
                continue
            for part in self.split_partial_sum(op):
                self.plans[part] = self.plan_op(part)
                ops.append(part)
        return Propagation(self.sg, self.axes, self.plans, self.produced, ops, frozenset(self.expert),
                           self.kept)

    def split_partial_sum(self, op: Op) -> list[Op]:
        """``op``, or for a sum where two or more Partial inputs meet Sharded ones on an
        axis: a sum of the Partial inputs (left Partial) and the rest of the sum."""
        if not op.partial_ok or len(op.inputs) < 3:
            return [op]
        layouts = [self.start_layout(t) for t in op.inputs]
        for axis in self.axes_of(op.outputs[0]):
            partial = [i for i, lay in enumerate(layouts) if isinstance(lay.get(axis), Partial)]
            sharded = [i for i, lay in enumerate(layouts) if isinstance(lay.get(axis), Shard)]
            if len(partial) >= 2 and sharded:
                break
        else:
            return [op]
        ins, (out_term,) = parse_spec(op.spec)
        out = op.outputs[0]
        part = Tensor(f"{out.name}.partial_sum", out.shape, out.dtype, out.role, out.tags)
        if out in self.expert:
            self.expert.add(part)
        first = Op(name=f"{op.name}.partial_sum", kind=op.kind, fn=op.fn,
                   inputs=tuple(op.inputs[i] for i in partial), outputs=(part,),
                   spec=",".join(ins[i] for i in partial) + "->" + out_term,
                   flop_terms=((len(partial) - 1, out_term, OTHER),), partial_ok=True, phase=op.phase,
                   layer=op.layer, block=op.block, attrs=dict(op.attrs), forward_op=op.forward_op)
        rest = [i for i in range(len(op.inputs)) if i not in partial]
        second = Op(name=op.name, kind=op.kind, fn=op.fn, inputs=(part, *(op.inputs[i] for i in rest)),
                    outputs=op.outputs, spec=",".join([out_term] + [ins[i] for i in rest]) + "->" + out_term,
                    flop_terms=((len(rest), out_term, OTHER),), partial_ok=True, phase=op.phase,
                    layer=op.layer, block=op.block, attrs=dict(op.attrs), forward_op=op.forward_op)
        self.readers[part] = [second]
        return [first, second]

    def sums_only(self, t: Tensor) -> bool:
        """Every op that reads ``t`` is a sum or a MoE regrouping (a Partial ``t`` may stay
        Partial for it: the sum reduces once, the regrouping reduces where it must)."""
        readers = self.readers.get(t, ())
        return bool(readers) and all(op.partial_ok or moe.is_boundary(op) for op in readers)

    def plan_op(self, op: Op) -> OpPlan:
        phase = "F" if op.phase == FORWARD else "B"
        if moe.is_boundary(op):
            plan = moe.plan_boundary(self, op, phase)
        else:
            plan = self.plan_within_view(op, phase)
        self.settle_outputs(plan, phase)
        return plan

    def view_axes(self, op: Op) -> list[str]:
        tensors = [t for t in op.inputs + op.outputs]
        views = {t in self.expert for t in tensors}
        if len(views) > 1:
            mixed = [t.name for t in tensors if t in self.expert]
            raise PropagationError(f"op {op.name} mixes expert-layer tensors ({', '.join(mixed)}) with others; "
                                   f"only a MoE dispatch or combine moves tokens between them")
        return self.expert_axes if views == {True} else self.axes

    def plan_within_view(self, op: Op, phase: str) -> OpPlan:
        ins, outs = parse_spec(op.spec)
        plan = OpPlan(op)
        start = []
        for t in op.inputs:
            layout = self.start_layout(t)
            if t in self.params:
                compute = dict(self.sg.compute_layout(t))
                if layout_key(compute) != layout_key(layout):
                    plan.pre += self.move(t, layout, compute, phase, param_gather=True)
                layout = compute
            start.append(layout)
        hints = [self.hint(o) for o in op.outputs]
        pinned = [t in self.params for t in op.inputs]
        grad_pins = [self.is_param_grad(o) for o in op.outputs]

        target = [dict(layout) for layout in start]
        out_layouts: list[dict] = [{} for _ in op.outputs]
        for axis in self.view_axes(op):
            cur = [_letter(layout, axis, term) for layout, term in zip(start, ins)]
            out_hint = [_letter(h, axis, term) if h else None for h, term in zip(hints, outs)]
            new_in, new_out, kept, kcomms, ring = self.resolve_axis(op, axis, ins, outs, cur, out_hint, pinned,
                                                                    grad_pins)
            if ring is not None:
                plan.ring = (axis, ring)
            for i, letter in enumerate(new_in):
                target[i] = _set(target[i], axis, _placement(letter, ins[i]))
            for j, letter in enumerate(new_out):
                out_layouts[j] = _set(out_layouts[j], axis, _placement(letter, outs[j]))
            for letter in kept:
                if letter in op.letter_sizes:
                    plan.letter_axes[letter] = plan.letter_axes.get(letter, ()) + (axis,)
            plan.kernel_comms += kcomms

        for t, s, tgt in zip(op.inputs, start, target):
            plan.pre += self.move(t, s, tgt, phase)
        plan.in_layouts = target
        plan.out_layouts = out_layouts
        return plan

    def settle_outputs(self, plan: OpPlan, phase: str) -> None:
        """Move each output to its hint right after the op; record what it is then."""
        op = plan.op
        for o, natural in zip(op.outputs, plan.out_layouts):
            h = self.hint(o)
            final = natural
            if h is not None and not self.is_param_grad(o):
                wanted = dict(natural)
                keep_partial = self.sums_only(o)
                for axis in self.axes_of(o):
                    if axis in h and not (keep_partial and isinstance(natural.get(axis), Partial)):
                        wanted = _set(wanted, axis, h[axis])
                plan.post += self.move(o, natural, wanted, phase)
                final = wanted
            self.produced[o] = final
            self.avail[(o, phase)] = {layout_key(final)}

    def resolve_axis(self, op, axis, ins, outs, cur, out_hint, pinned, grad_pins):
        """New input letters, output letters, the letters kept sharded, the kernel's own
        collectives and the ring letter (or None) of ``op`` on ``axis``."""
        n = len(cur)
        new = list(cur)
        # 0. a kernel that streams a letter's shards around a ring of the axis (ring
        # attention's keys) keeps the inputs sharded on it as they are
        ring = op.attrs.get("ring_letter") if axis in self.sg.rings else None
        if ring is not None and ring not in cur:
            ring = None
        ringed = [i for i, c in enumerate(cur) if ring is not None and c == ring]
        for i in ringed:
            new[i] = None
        # a parameter's gradient must come out in the parameter's own sharding
        pin_out = next((h for h, pin in zip(out_hint, grad_pins) if pin and h not in (None, "P")), None)
        # 1. partial inputs
        if any(c == "P" for c in cur):
            if (op.partial_ok or op.kind == "view") and all(c == "P" for c in cur):
                return new, ["P"] * len(outs), (), [], None
            if op.partial_ok and sum(c == "P" for c in cur) >= 2 and all(c in (None, "P") for c in cur):
                # Replicate terms join the partial sums as Partial (free): one reduction
                return ["P"] * n, ["P"] * len(outs), (), [], None
            for i, c in enumerate(cur):
                if c != "P":
                    continue
                choice = None
                for h in out_hint:
                    if h not in (None, "P") and h in ins[i]:
                        choice = h
                        break
                if choice is None:
                    for j in range(n):
                        if j != i and cur[j] not in (None, "P") and cur[j] in ins[i]:
                            choice = cur[j]
                            break
                new[i] = choice
        # 2. conflicting letters (a letter and the slot letter an op writes it into, as
        # a cache write's sequence and cache slots, are one sharding seen from two sides)
        letters = [c for c in new if c is not None]
        keep = None
        equiv = self.token_slot_equivalents(op, letters, axis, out_hint)
        if equiv:
            keep = next(c for c in letters if c in equiv)
            letters = [keep if c in equiv else c for c in letters]
            new = [keep if c in equiv else c for c in new]
        if letters:
            distinct = list(dict.fromkeys(letters))
            pinned_letters = list(dict.fromkeys(c for c, pin in zip(new, pinned) if pin and c is not None))
            if pin_out is not None and pin_out not in pinned_letters:
                pinned_letters.append(pin_out)
            if len(pinned_letters) > 1:
                raise PropagationError(
                    f"op {op.name}: parameters sharded on different dims ({', '.join(pinned_letters)}) "
                    f"on axis {axis}"
                )
            preferred = None if pinned_letters or equiv else self.preferred_letter(op, axis, ins)
            if pinned_letters:
                keep = pinned_letters[0]
            elif preferred is not None:
                keep = preferred
            else:
                hinted = [h for h in out_hint if h in distinct]
                keep = hinted[0] if hinted else distinct[0]
            for i, c in enumerate(new):
                if c is not None and c != keep:
                    new[i] = keep if keep in ins[i] else None
        elif pin_out is not None and any(pin_out in term for term in ins):
            keep = pin_out
        if equiv and keep is not None and keep in equiv:
            new = [next((c for c in ins[i] if c in equiv), x) if x == keep else x for i, x in enumerate(new)]
        # 3. free slicing of replicated inputs that have the kept letter
        if keep is not None:
            for i in range(n):
                if new[i] is None and keep in ins[i] and i not in ringed:
                    new[i] = keep
        for i in ringed:
            new[i] = ring
        # 4. letters needed whole
        kcomms = []
        if keep is not None and keep in op.whole:
            declared = op.attrs.get("sharded_whole", {}).get(keep)
            if declared:
                for kind, letters_, nbytes in declared:
                    kcomms.append(KernelComm(CollectiveType[kind.upper()], axis, letters_, nbytes))
            else:
                new = [None if c == keep else c for c in new]
                keep = None
        # 5. outputs
        out = []
        for j, term in enumerate(outs):
            if ring is not None and ring in term:
                letter = ring  # each shard's result comes back around the ring to its owner
            elif keep is None:
                letter = None
            elif keep in term:
                letter = keep
            elif equiv and keep in equiv and any(c in equiv for c in term):
                letter = next(c for c in term if c in equiv)
            elif keep in op.linear_reduce:
                letter = "P"
            elif keep in op.whole:
                letter = None  # completed by the kernel's own collectives
            else:
                raise PropagationError(
                    f"op {op.name}: index {keep!r} is sharded on {axis} but output {j} neither keeps nor sums it"
                )
            if letter is None and out_hint[j] not in (None, "P") and all(out_hint[j] not in t for t in ins):
                letter = out_hint[j]  # a scatter writes only its shard of an output-only dim
            out.append(letter)
        if keep is None:
            kept = ()
        elif equiv and keep in equiv:
            kept = tuple(sorted(equiv))  # the letter and the slot letter it stands for together
        else:
            kept = (keep,)
        if ring is not None:
            kept += (ring,)
        return new, out, kept, kcomms, ring

    def preferred_letter(self, op: Op, axis: str, ins: list[str]) -> str | None:
        """The letter a strategy asks ops of this block to keep sharded on ``axis``: the
        first input letter whose size is one of the preferred dims, in their order."""
        prefs = self.sg.prefer.get(axis)
        if not prefs:
            return None
        dims = prefs.get(op.block, prefs.get(""))
        for name in dims or ():
            size = sym.dim(name)
            for letter, expr in op.letter_sizes.items():
                if expr == size and any(letter in term for term in ins):
                    return letter
        return None

    def token_slot_equivalents(self, op: Op, sharded: list[str], axis: str, hints=()) -> frozenset:
        """For an op that writes a letter's rows into slots (``attrs`` ``token_letters`` and
        ``slot_letter``, as a cache write): {token letter sharded here, slot letter}, else
        empty.  The token letter is the one sharded on this axis: on an input, else in an
        output's hint, else in the forward op's plan.  (MoE dispatch and combine, which
        also regroup tokens into slots, are planned by :mod:`.moe`.)"""
        slot = op.attrs.get("slot_letter")
        if not slot or not sharded:
            return frozenset()
        tokens = op.attrs.get("token_letters", "")
        if not set(sharded) <= set(tokens) | {slot}:
            return frozenset()
        token = next((c for c in sharded if c in tokens), None)
        if token is None:
            token = next((c for c in hints if c is not None and c in tokens), None)
        if token is None and op.forward_op in self.plans:
            fwd = self.plans[op.forward_op].letter_axes
            token = next((c for c in tokens if axis in fwd.get(c, ())), None)
        if token is None:
            raise PropagationError(f"op {op.name}: its slots are sharded on {axis} but no token letter is")
        return frozenset({token, slot})

    # ------------------------------------------------------------------ moving a tensor
    def move(self, t: Tensor, src: dict, dst: dict, phase: str, param_gather: bool = False) -> list[Redistribute]:
        key = layout_key(dst)
        if layout_key(src) == key:
            return []
        have = self.avail.setdefault((t, phase), set())
        if key in have:
            return []
        if phase == "B" and (t, key) in self.reduced_in_forward:
            self.kept[t] = dict(dst)  # the forward op kept the reduced tensor
            have.add(key)
            return []
        if phase == "B" and key in self.avail.get((t, "F"), ()) and all(
                a in self.sg.reuse_forward for a in self.axes_of(t)
                if layout_key({a: src[a]} if a in src else {}) != layout_key({a: dst[a]} if a in dst else {})):
            have.add(key)  # backward reads the tensor as forward moved it (kept for backward)
            return []
        steps = []
        layout = dict(src)
        for axis in self.axes_of(t):
            a, b = layout.get(axis), dst.get(axis)
            if layout_key({axis: a} if a else {}) == layout_key({axis: b} if b else {}):
                continue
            kind = transition_kind(a or Replicate(), b or Replicate())
            after = _set(layout, axis, b)
            steps.append(Redistribute(t, axis, kind, layout, after, param_gather))
            layout = after
        have.add(key)
        if phase == "F" and t.role is Role.ACTIVATION and any(isinstance(p, Partial) for p in src.values()):
            self.reduced_in_forward.add((t, key))
        return steps


def propagate(sg: ShardedGraph) -> Propagation:
    """Layouts and collectives of every forward and backward op of ``sg``."""
    return _Propagator(sg).run()
