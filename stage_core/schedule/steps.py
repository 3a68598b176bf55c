"""Schedule steps, and the structure every schedule's order must have.

A schedule (``ScheduleSpec.order(stages, micro_batches, virtual)``) returns, for each
pipeline stage, the list of steps it runs in order.  A step is ``(kind, micro_batch,
chunk)``: ``chunk`` is the virtual stage on that rank (0 without interleaving) and
``kind`` one of :data:`STEP_KINDS`, as in the zero-bubble paper (Qi et al., ICLR 2024):

* ``"F"``: the forward of the micro-batch through the chunk;
* ``"B"``: its backward: the whole backward, or, when the stage also has a ``"W"``
  step for that micro-batch and chunk, only the ops on the path to the input
  gradient (and its send to the previous stage);
* ``"W"``: the weight gradients of that micro-batch and chunk (the weight-gradient
  matmuls, norm and bias gradients) and the gradient buckets they complete.

A step may also be a *pair* ``(("F", m1, c1), ("B", m2, c2))``: the forward of one
micro-batch and the backward of another run overlapped, as DualPipe does (DeepSeek-V3
report, 2024), so that one's communication (an expert all-to-all) hides behind the
other's compute: lowering interleaves their ops layer by layer.

The host checks an order before anything is lowered (:func:`order_problem`): one list
per stage; known kinds; micro-batches and chunks in range; every (micro-batch, chunk)
exactly one F and one B per stage, at most one W, F before B before W; a pair is one F
and one B.  Under the ``"dual"`` placement (DualPipe's two copies, see :data:`PLACEMENTS`)
a micro-batch runs one of the stage's two chunks, the copy of its direction, the same on
every stage.
"""

from __future__ import annotations

from typing import Any, Sequence

#: the kinds of schedule step
STEP_KINDS = ("F", "B", "W")
#: a schedule step: (kind, micro-batch, chunk)
Step = tuple[str, int, int]


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def order_problem(order: Any, stages: int, micro_batches: int, virtual: int, placement: str = "loop") -> str | None:
    """What is wrong with a schedule's ``order`` for ``stages`` x ``micro_batches`` x
    ``virtual`` chunks a stage (its chunk indices: under ``"dual"``, 2), in one line, or
    None when it is well formed."""
    if isinstance(order, (str, bytes)) or not isinstance(order, Sequence):
        return f"order is a {type(order).__name__}, not one list of steps per stage"
    if len(order) != stages:
        return f"order has {len(order)} step lists for {stages} pipeline stages"
    routes: dict[int, tuple[int, int]] = {}
    for stage, steps in enumerate(order):
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
            return f"stage {stage}: steps are a {type(steps).__name__}, not a list of (kind, micro-batch, chunk)"
        seen: dict[tuple[int, int], list[str]] = {}
        flat = []
        for i, step in enumerate(steps):
            if is_pair(step):
                if (step[0][0], step[1][0]) != ("F", "B"):
                    return (f"stage {stage}, step {i}: a pair of steps is a forward and a backward run overlapped, "
                            f"(F, B); got ({step[0][0]!r}, {step[1][0]!r})")
                flat += [(i, step[0]), (i, step[1])]
            else:
                flat.append((i, step))
        for i, step in flat:
            if not isinstance(step, Sequence) or isinstance(step, (str, bytes)) or len(step) != 3:
                return f"stage {stage}, step {i}: {step!r} is not a (kind, micro-batch, chunk) triple"
            kind, mb, chunk = step
            if kind not in STEP_KINDS:
                return (f"stage {stage}, step {i}: unknown step kind {kind!r}; known: "
                        f"{', '.join(STEP_KINDS)} (forward, backward for inputs, weight gradients)")
            if not _is_index(mb) or mb >= micro_batches:
                return f"stage {stage}, step {i} {tuple(step)}: micro-batch {mb!r} is not in 0..{micro_batches - 1}"
            if not _is_index(chunk) or chunk >= virtual:
                return f"stage {stage}, step {i} {tuple(step)}: chunk {chunk!r} is not in 0..{virtual - 1}"
            done = seen.setdefault((mb, chunk), [])
            if kind in done:
                return f"stage {stage}, step {i}: {kind} of micro-batch {mb}, chunk {chunk} runs twice"
            if kind == "B" and "F" not in done:
                return f"stage {stage}, step {i}: B of micro-batch {mb}, chunk {chunk} comes before its F"
            if kind == "W" and "B" not in done:
                return f"stage {stage}, step {i}: W of micro-batch {mb}, chunk {chunk} comes before its B"
            done.append(kind)
        if placement == "dual":
            problem = _dual_problem(stage, seen, micro_batches, routes)
            if problem is not None:
                return problem
            continue
        for mb in range(micro_batches):
            for chunk in range(virtual):
                done = seen.get((mb, chunk), [])
                for kind in ("F", "B"):
                    if kind not in done:
                        return f"stage {stage}: micro-batch {mb}, chunk {chunk} has no {kind} step"
    return None


def _dual_problem(stage: int, seen: dict[tuple[int, int], list[str]], micro_batches: int,
                  routes: dict[int, tuple[int, int]]) -> str | None:
    """Under the dual placement: each micro-batch runs one copy on the stage (its F and B),
    and the copy it ran on the first stage that lists it (``routes``: micro-batch -> (copy,
    stage), filled as stages are checked)."""
    for mb in range(micro_batches):
        ran = [chunk for chunk in (0, 1) if seen.get((mb, chunk))]
        if len(ran) != 1:
            return (f"stage {stage}: micro-batch {mb} runs {'both copies (chunks 0 and 1)' if ran else 'no chunk'}; "
                    f"under placement 'dual' a micro-batch runs the copy of its direction, chunk 0 (fed from the "
                    f"first stage) or 1 (fed from the last), on every stage")
        chunk = ran[0]
        for kind in ("F", "B"):
            if kind not in seen[(mb, chunk)]:
                return f"stage {stage}: micro-batch {mb}, chunk {chunk} has no {kind} step"
        first = routes.setdefault(mb, (chunk, stage))
        if first[0] != chunk:
            return (f"stage {stage}: micro-batch {mb} runs chunk {chunk}, but chunk {first[0]} on stage {first[1]}: "
                    f"under placement 'dual' a micro-batch keeps its direction (copy) through the pipeline")
    return None


def is_pair(step: Any) -> bool:
    """Whether ``step`` is an overlapped pair of steps, not a (kind, micro-batch, chunk) triple."""
    return (isinstance(step, Sequence) and not isinstance(step, (str, bytes)) and len(step) == 2
            and all(isinstance(s, Sequence) and not isinstance(s, (str, bytes)) and len(s) == 3 for s in step))


def flat_steps(steps: Sequence) -> list[Step]:
    """A stage's steps with each overlapped pair as its two steps, forward first."""
    out: list[Step] = []
    for step in steps:
        out.extend(step if is_pair(step) else [step])
    return out


def split_backwards(order: Sequence[Sequence[Step]]) -> list[set[tuple[int, int]]]:
    """Per stage, the (micro-batch, chunk) pairs whose backward is split into B and W."""
    return [{(mb, chunk) for kind, mb, chunk in flat_steps(steps) if kind == "W"} for steps in order]


# --------------------------------------------------------------------------- chunk placement
#: how a schedule's chunks sit on the pipeline stages (``ScheduleSpec.placement``):
#: ``"loop"`` (interleaved), ``"v"`` (ZB-V, DualPipeV) and ``"dual"`` (DualPipe: the model
#: cut into as many chunks as stages, each stage holding two copies, see :func:`chunk_of`)
PLACEMENTS = ("loop", "v", "dual")


def copies(placement: str) -> int:
    """How many copies of the model the stages hold together: 2 under ``"dual"``, else 1.
    A schedule's ``chunks`` (the chunk indices its order uses) are the plan's virtual stages
    times this."""
    return 2 if placement == "dual" else 1


def chunk_of(placement: str, stage: int, local: int, stages: int) -> int:
    """The model chunk (in layer order) that ``stage`` runs as its ``local``-th chunk.

    ``"loop"`` (interleaved 1F1B): chunk ``local * stages + stage``, the layers going round the
    stages ``virtual`` times.  ``"v"`` (ZB-V, DualPipeV): the layers go down the stages and come
    back up, so stage i holds chunks i and 2·stages − 1 − i (and so on for more chunks): the
    first and the last chunk are both on stage 0, and the turn needs no message.  ``"dual"``
    (DualPipe, DeepSeek-V3 report §3.2.1): the model is cut into ``stages`` chunks and stage i
    holds two copies, chunk i as its chunk 0, run by the micro-batches fed from the first stage
    (the forward direction), and chunk stages − 1 − i as its chunk 1, run by those fed from
    the last stage (the reverse direction): every chunk is on two stages, i and stages − 1 − i."""
    if placement == "dual":
        return stages - 1 - stage if local else stage
    if placement == "v" and local % 2:
        return local * stages + stages - 1 - stage
    return local * stages + stage


def stage_of(placement: str, chunk: int, stages: int, copy: int = 0) -> int:
    """The stage that runs ``chunk`` (the inverse of :func:`chunk_of`); under ``"dual"``, the
    stage holding it as ``copy`` (0: the forward direction's, 1: the reverse's)."""
    if placement == "dual":
        return stages - 1 - chunk if copy else chunk
    local, pos = divmod(chunk, stages)
    return stages - 1 - pos if placement == "v" and local % 2 else pos


def simulate_order(order: Sequence, stages: int, t_f: float, t_b: float, t_w: float,
                   placement: str = "loop") -> tuple[float, list[float]]:
    """An order's step under the pipeline papers' cost model: every chunk's forward takes
    ``t_f``, its input-gradient backward ``t_b`` and its weight gradients ``t_w`` (a backward
    not split into B and W takes ``t_b + t_w``); messages take no time; a stage runs its steps
    in order, an overlapped pair's two parts one after the other.  F of a chunk waits for the
    chunk before it, B for the chunk after it and its own F, W for its B.

    Returns (the step, per stage its idle time between its first step's start and its last
    step's end): what the zero-bubble paper and the DualPipe README call the bubble."""
    if placement == "dual":  # two copies of a model of ``stages`` chunks; (kind, chunk, micro-batch) runs once
        chunks = stages
    else:
        chunks = stages * max((c for steps in order for _, _, c in flat_steps(steps)), default=0) + stages
    split = [{(m, c) for k, m, c in flat_steps(steps) if k == "W"} for steps in order]
    end: dict[tuple[str, int, int], float] = {}
    first: list[float | None] = [None] * stages
    busy = [0.0] * stages
    pos, free = [0] * stages, [0.0] * stages
    left = sum(len(steps) for steps in order)
    while left:
        moved = False
        for s in range(stages):
            if pos[s] == len(order[s]):
                continue
            step = order[s][pos[s]]
            parts = list(step) if is_pair(step) else [step]
            own = {(k, chunk_of(placement, s, c, stages), m) for k, m, c in parts}
            deps = []
            for k, m, c in parts:
                g = chunk_of(placement, s, c, stages)
                deps += {"F": [("F", g - 1, m)] if g else [],
                         "B": [("F", g, m)] + ([("B", g + 1, m)] if g < chunks - 1 else []),
                         "W": [("B", g, m)]}[k]
            deps = [d for d in deps if d not in own]
            if not all(d in end for d in deps):
                continue
            start = max([free[s]] + [end[d] for d in deps])
            took = sum(t_b + t_w if k == "B" and (m, c) not in split[s] else {"F": t_f, "B": t_b, "W": t_w}[k]
                       for k, m, c in parts)
            for key in own:
                end[key] = start + took
            first[s] = start if first[s] is None else first[s]
            free[s], busy[s], pos[s], left, moved = start + took, busy[s] + took, pos[s] + 1, left - 1, True
        if not moved:
            raise ValueError("the stages' orders wait on each other: no step can run")
    idle = [free[s] - (first[s] or 0.0) - busy[s] for s in range(stages)]
    return max(free), idle
