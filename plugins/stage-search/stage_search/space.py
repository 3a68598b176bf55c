"""The plans of a model on a cluster: every combination of the plan's choices that the core
and the installed strategies accept.

Choices enumerated (each narrowed by the user's constraints):

* tp: powers of two up to the GPUs of one node; cp: powers of two up to 16; pp:
  divisors of the world over tp x cp up to ``max_pp`` and the layer count; dp: the rest;
  ep (MoE models): divisors of the expert count that divide dp x cp;
* micro-batch size 1, 2, 4, 8 (the global batch fixes the micro-batch count);
* virtual stages 1, 2, 4, 8 (interleaved 1F1B; 1: 1F1B or GPipe);
* ZeRO 0-3 (with dp x cp above 1); recompute none, selective, full;
* sequence parallel whenever tp > 1 (Megatron's advice: it only saves memory);
* layers per chunk: an even split where the layers divide, else the balanced uneven
  split (:func:`balanced`).

A plan the core or a strategy refuses is dropped with its reason (:class:`Space`
counts them).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Sequence

from stage_core.api import Plan, UsageError, balanced_split, divisors

TP = (1, 2, 4, 8, 16, 32, 64)
CP = (1, 2, 4, 8, 16)
MBS = (1, 2, 4, 8)
VP = (1, 2, 4, 8)
ZERO = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")


@dataclass
class Constraints:
    """What the user fixed (None: searched)."""

    tp: int | None = None
    cp: int | None = None
    pp: int | None = None
    ep: int | None = None
    max_pp: int | None = None
    micro_batch_size: int | None = None
    zero: int | None = None
    recompute: str | None = None
    schedules: tuple[str, ...] = ("1f1b", "interleaved")


@dataclass
class Space:
    plans: list[Plan]
    refused: dict[str, int] = field(default_factory=dict)  # reason -> plans

    @property
    def enumerated(self) -> int:
        return len(self.plans) + sum(self.refused.values())


@lru_cache(maxsize=None)
def balanced(layers: int, chunks: int) -> tuple[int, ...]:
    """The split ``--stage-layers auto`` gives ``layers`` equal layers (the core's
    :func:`~stage_core.parallel.split.balanced_split`, as the pp strategy calls it)."""
    return balanced_split([1] * layers, chunks)


def stage_layers(layers: int, chunks: int) -> tuple[int, ...] | None:
    """None (an even split) when ``chunks`` divides ``layers``, else the balanced split."""
    if chunks <= 1 or layers % chunks == 0:
        return None
    return balanced(layers, chunks)


def enumerate_plans(world: int, global_batch: int, seq_len: int, layers: int, *, gpus_per_node: int,
                    experts: int = 0, constraints: Constraints | None = None,
                    validate=None) -> Space:
    """Every plan of the choices above on ``world`` GPUs; ``validate(plan)`` returns the
    reasons a plan is refused (the core's and the strategies'), empty when it is valid."""
    c = constraints or Constraints()

    def choose(given, values: Iterable[int]) -> Sequence[int]:
        return (given,) if given is not None else tuple(values)

    space = Space([])
    tps = choose(c.tp, (t for t in TP if t <= gpus_per_node))
    for tp in tps:
        if world % tp:
            continue
        for cp in choose(c.cp, CP):
            if world % (tp * cp) or seq_len % (2 * cp * (tp if tp > 1 else 1)):
                continue
            rest = world // (tp * cp)
            pps = [p for p in divisors(rest) if p <= min(layers, c.max_pp or layers)]
            for pp in choose(c.pp, pps):
                if rest % pp:
                    continue
                dp = rest // pp
                eps = [1] if not experts else [e for e in divisors(experts) if (dp * cp) % e == 0]
                for ep, mbs in itertools.product(choose(c.ep, eps), choose(c.micro_batch_size, MBS)):
                    if global_batch % (dp * mbs):
                        continue
                    m = global_batch // (dp * mbs)
                    for vp in VP if pp > 1 else (1,):
                        if pp * vp > layers:
                            continue
                        schedules = [s for s in c.schedules if (s == "interleaved") == (vp > 1)]
                        if vp > 1 and m % pp:
                            space.refused["interleaved 1F1B needs the micro-batches to be a multiple of pp"] = \
                                space.refused.get("interleaved 1F1B needs the micro-batches to be a multiple of "
                                                  "pp", 0) + len(schedules) * _variants(c, dp * cp)
                            continue
                        split = stage_layers(layers, pp * vp)
                        for schedule in schedules:
                            for zero in choose(c.zero, ZERO if dp * cp > 1 else (0,)):
                                for recompute in ((c.recompute,) if c.recompute else RECOMPUTE):
                                    plan = Plan(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, sp=tp > 1, zero=zero,
                                                recompute=recompute, schedule=schedule, virtual_stages=vp,
                                                micro_batch_size=mbs, micro_batches=m, seq_len=seq_len,
                                                stage_layers=split)
                                    reasons = _check(plan, validate)
                                    if reasons:
                                        space.refused[reasons] = space.refused.get(reasons, 0) + 1
                                    else:
                                        space.plans.append(plan)
    return space


def _variants(c: Constraints, dpcp: int) -> int:
    zeros = 1 if c.zero is not None else (len(ZERO) if dpcp > 1 else 1)
    return zeros * (1 if c.recompute else len(RECOMPUTE))


def _check(plan: Plan, validate) -> str:
    try:
        plan.check_basic()
    except UsageError as exc:
        return _reason(str(exc))
    problems = validate(plan) if validate is not None else ()
    return _reason(problems[0]) if problems else ""


def _reason(text: str) -> str:
    """A refusal without the plan's own numbers, so that plans refused alike count together."""
    return "".join("N" if ch.isdigit() else ch for ch in text).replace("NN", "N").replace("NN", "N")


def enumerate_decode(world: int, requests: int, context: int, layers: int, *, gpus_per_node: int,
                     experts: int = 0, constraints: Constraints | None = None, validate=None) -> Space:
    """Decode plans on ``world`` GPUs serving ``requests`` requests of ``context`` tokens:
    tp, pp, ep (MoE), dp the rest; each replica's requests in one micro-batch or in pp of
    them (one per stage in flight).  No ZeRO, recompute, sequence or context parallel:
    decode has no backward and one token per request."""
    c = constraints or Constraints()
    space = Space([])

    def refuse(reason: str) -> None:
        space.refused[reason] = space.refused.get(reason, 0) + 1

    for tp in ((c.tp,) if c.tp else [t for t in TP if t <= gpus_per_node]):
        if world % tp:
            continue
        rest = world // tp
        for pp in ((c.pp,) if c.pp else [p for p in divisors(rest) if p <= min(layers, c.max_pp or layers)]):
            if rest % pp:
                continue
            dp = rest // pp
            if requests % dp:
                refuse("the requests must divide over the data-parallel replicas")
                continue
            per = requests // dp
            eps = [1] if not experts else [e for e in divisors(experts) if dp % e == 0]
            for ep in ((c.ep,) if c.ep else eps):
                for m in sorted({1, pp}):
                    if per % m:
                        refuse("a replica's requests must divide over the micro-batches")
                        continue
                    plan = Plan(tp=tp, pp=pp, dp=dp, ep=ep, task="decode", context_len=context,
                                micro_batch_size=per // m, micro_batches=m, stage_layers=stage_layers(layers, pp))
                    reasons = _check(plan, validate)
                    if reasons:
                        refuse(reasons)
                    else:
                        space.plans.append(plan)
    return space
