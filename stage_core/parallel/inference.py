"""Lowering an inference graph (prefill or decode) to one program per pipeline stage.

Requests flow through the stages in micro-batches, in the forward order of the
plan's schedule: a stage runs a micro-batch's forward on its chunks, sends the
activation on and starts the next micro-batch, so with pp stages and m
micro-batches the first stage idles (pp - 1) slots at the end of a step and the
last one (pp - 1) at its start (the bubble).  Decode chains its steps: step j + 1 of
a micro-batch embeds the token step j sampled, which the last stage sends back to
the first.  Each step binds its own dims (the context grows by one token a step)
from one compiled evaluator.

No backward, no gradient traffic, no optimizer.  Memory per rank is the weights,
the cache of every micro-batch's requests at the last step's context, and the
largest working set of one kernel (its activation inputs and outputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.ops import FORWARD, Op
from ..ir.tensor import Role
from ..trace import NodeType
from .lower import Lowered, Lowerer, Sizes, _Program
from .placement import Shard
from ..schedule.steps import flat_steps


@dataclass
class InferenceLowered(Lowered):
    """Also, per pipeline stage, where each step of each micro-batch sits in the stage's
    program: ``spans[stage]`` lists (step, micro-batch, chunk, first node, last node); and
    where each cache tensor lives (``caches``, by name)."""

    spans: dict[int, list[tuple[int, int, int, int, int]]] = field(default_factory=dict)
    caches: dict[str, "CacheLayout"] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheLayout:
    """Where one cache tensor lives: its pipeline stage and layer, each dim's size (the
    whole job's, at the last step) and the mesh axes that shard it, its bytes per element,
    and which dims are the requests (b) and the sequence."""

    stage: int
    layer: int | None
    sizes: tuple[int, ...]
    shards: tuple[tuple[str, ...], ...]
    itemsize: int
    seq_dim: int


class InferenceLowerer(Lowerer):
    model_flops_per_forward = 1  # inference runs the forward matmuls only

    def __init__(self, prop, plan, mesh, steps: list[dict[str, int]], schedule, hw=None, kernel_seconds=None):
        super().__init__(prop, plan, mesh, steps[-1], schedule, hw, kernel_seconds)
        self.step_sizes: list[Sizes] = [self.sizes.at(v) for v in steps[:-1]] + [self.sizes]
        self.feedback = list(self.g.feedback.items())  # (sampled tokens, the token ids the next step reads)
        self.cache_ops = [op for op in self.fwd_ops if op.fn == "cache_write"]
        self.cached = {op.outputs[0] for op in self.cache_ops}  # the caches, and views of them
        for op in self.fwd_ops:
            if op.kind == "view" and any(t in self.cached for t in op.inputs):
                self.cached.update(op.outputs)
        self.spans: dict[int, list[tuple[int, int, int, int, int]]] = {}

    def use(self, sizes: Sizes) -> None:
        self.sizes = sizes
        self._costs = {}
        self._kernels = {}

    # ------------------------------------------------------------------ one program per stage
    def program(self, stage: int) -> tuple[_Program, int]:
        prog = _Program(self.group_size)
        m_total = self.plan.micro_batches
        order = [step for step in flat_steps(self.schedule(self.stages, m_total, self.virtual)[stage])
                 if step[0] == "F"]
        index = {x: i for i, x in enumerate(self.crossings)}
        per_message = len(self.crossings) + len(self.feedback)
        sampled: dict[tuple[int, int], tuple[int, ...]] = {}  # (feedback index, micro-batch) -> its node
        steps = len(self.step_sizes)
        prog.tags = steps * m_total * per_message  # pipeline tags come first; kernels' own messages follow
        spans = self.spans.setdefault(stage, [])
        for j, sizes in enumerate(self.step_sizes):
            self.use(sizes)
            for _, m, local_chunk in order:
                c = self.chunk_of(stage, local_chunk)
                versions: dict = {}
                first = len(prog.nodes)
                tag = (f"step{j}." if steps > 1 else "") + f"mb{m}" + (f".chunk{c}" if self.chunks > 1 else "")
                base = 1 + (j * m_total + m) * per_message
                if j > 0:
                    self.take_feedback(prog, c, m, versions, sampled, base - m_total * per_message, tag)
                for x in self.crossings:
                    t, src, dst, _ = x
                    if dst == c:
                        rid = prog.p2p(f"{tag}.fwd:recv:{t.name}", NodeType.COMM_RECV, self.crossing_bytes(t),
                                       self.peer_key(src, dst, False), base + index[x], ())
                        versions[(t, self.lk(self.prop.produced.get(t, {})))] = (rid,)
                        versions[(t, None)] = (rid,)
                for op in self.chunk_ops(self.fwd_ops, c):
                    self.emit_op(prog, op, versions, f"{tag}.fwd", {}, FORWARD)
                for x in self.crossings:
                    t, src, dst, _ = x
                    if src == c:
                        prog.p2p(f"{tag}.fwd:send:{t.name}", NodeType.COMM_SEND, self.crossing_bytes(t),
                                 self.peer_key(src, dst, True), base + index[x], versions.get((t, None), ()))
                if j < steps - 1:
                    self.give_feedback(prog, c, m, versions, sampled, base + len(self.crossings), tag)
                prog.end_step(m)
                spans.append((j, m, c, first, len(prog.nodes) - 1))
        return prog, 0

    def crossing_bytes(self, t) -> int:
        return self.sizes.nbytes(t, self.prop.produced.get(t, {}))

    def chunk_of_tensor(self, t) -> int:
        return self.chunk[self.producer[t]]

    def reader_chunk(self, t) -> int:
        return next(self.chunk[op] for op in self.fwd_ops if t in op.inputs)

    def give_feedback(self, prog, c, m, versions, sampled, tag_base, tag) -> None:
        """After step j: the sampled tokens go to where step j + 1 embeds them."""
        for i, (out, into) in enumerate(self.feedback):
            if self.chunk_of_tensor(out) != c:
                continue
            deps = versions.get((out, None), ())
            dst = self.reader_chunk(into)
            if self.stage_of(dst) == self.stage_of(c):
                sampled[(i, m)] = deps
            else:
                prog.p2p(f"{tag}.feedback:send:{out.name}", NodeType.COMM_SEND, self.crossing_bytes(out),
                         self.peer_key(c, dst, True), tag_base + i, deps)

    def take_feedback(self, prog, c, m, versions, sampled, tag_base, tag) -> None:
        """Before step j + 1: the token ids it embeds are what step j sampled."""
        for i, (out, into) in enumerate(self.feedback):
            if self.reader_chunk(into) != c:
                continue
            src = self.chunk_of_tensor(out)
            if self.stage_of(src) == self.stage_of(c):
                deps = sampled.pop((i, m))
            else:
                deps = (prog.p2p(f"{tag}.feedback:recv:{out.name}", NodeType.COMM_RECV, self.crossing_bytes(out),
                                 self.peer_key(src, c, False), tag_base + len(self.crossings) + i, ()),)
            versions[(into, None)] = deps

    # ------------------------------------------------------------------ memory
    def memory(self, stage: int, activations: int) -> dict[str, int]:
        params = sum(self.sizes.nbytes(p, self.sg.storage_layout(p)) for p in self.stage_params(stage))
        chunks = set(self.stage_chunks(stage))
        cache = self.plan.micro_batches * sum(
            self.sizes.nbytes(op.outputs[0], self.prop.produced[op.outputs[0]])
            for op in self.cache_ops if self.chunk[op] in chunks)
        working = max((self.working_set(op) for c in chunks for op in self.chunk_ops(self.fwd_ops, c)
                       if op.is_kernel), default=0)
        return {"parameters": params, "gradients": 0, "optimizer": 0, "activations": working,
                "kv_cache": cache, "total": params + working + cache}

    def working_set(self, op: Op) -> int:
        """Bytes of the activations one kernel reads and writes (not weights, not the cache)."""
        plan = self.prop.plan(op)
        pairs = list(zip(op.inputs, plan.in_layouts)) + list(zip(op.outputs, plan.out_layouts))
        return sum(self.sizes.nbytes(t, layout) for t, layout in pairs
                   if t.role in (Role.ACTIVATION, Role.INPUT) and t not in self.cached)


    def run(self) -> InferenceLowered:
        lowered = super().run()
        seq = {c.tensor: c.seq_dim for c in self.g.caches}
        caches = {}
        for op in self.cache_ops:
            t = op.outputs[0]
            layout = self.prop.produced[t]
            shards = tuple(tuple(a for a, p in layout.items() if isinstance(p, Shard) and p.dim == i)
                           for i in range(t.rank))
            caches[t.name] = CacheLayout(self.stage_of(self.chunk[op]), op.layer,
                                         tuple(self.sizes.value[d] for d in t.shape), shards, t.itemsize, seq[t])
        return InferenceLowered(lowered.programs, lowered.reports, lowered.group_keys, lowered.stage_layers,
                                spans=self.spans, caches=caches)


def lower_inference(prop, plan, mesh, steps: list[dict[str, int]], schedule, hw=None,
                    kernel_seconds=None) -> InferenceLowered:
    """Programs and reports per rank class of an inference graph; ``steps`` binds the dims
    of each step in order (one for prefill; decode's context grows a token a step)."""
    return InferenceLowerer(prop, plan, mesh, steps, schedule, hw, kernel_seconds).run()
