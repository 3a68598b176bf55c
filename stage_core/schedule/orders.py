"""Pipeline schedules as step orders.

A schedule gives, for each pipeline rank (stage), the order in which it runs its
steps; a step is ``("F" | "B", micro_batch, chunk)``, chunk being the virtual
stage index on that rank (0 without interleaving).  Dependencies between ranks
(a forward needs the previous stage's activation, a backward the next stage's
gradient) are implied by the step itself; the order is what the schedule adds.
"""

from __future__ import annotations

from ..errors import UsageError

Step = tuple[str, int, int]


def gpipe(stages: int, micro_batches: int, virtual: int = 1) -> list[list[Step]]:
    """All forwards, then all backwards (Huang et al. 2019)."""
    return [
        [("F", m, 0) for m in range(micro_batches)] + [("B", m, 0) for m in range(micro_batches)]
        for _ in range(stages)
    ]


def one_f_one_b(stages: int, micro_batches: int, virtual: int = 1) -> list[list[Step]]:
    """PipeDream-flush 1F1B (Narayanan et al. 2021): stage i warms up with p-i-1
    forwards, alternates one forward and one backward, then drains."""
    out = []
    for i in range(stages):
        warm = min(stages - i - 1, micro_batches)
        order: list[Step] = [("F", m, 0) for m in range(warm)]
        f, b = warm, 0
        while f < micro_batches:
            order.append(("F", f, 0))
            f += 1
            order.append(("B", b, 0))
            b += 1
        order += [("B", m, 0) for m in range(b, micro_batches)]
        out.append(order)
    return out


def interleaved_1f1b(stages: int, micro_batches: int, virtual: int) -> list[list[Step]]:
    """Interleaved 1F1B (Narayanan et al. 2021 §2.2): each rank holds ``virtual``
    chunks; micro-batches advance in groups of ``stages``.  Needs micro_batches to be
    a multiple of stages."""
    if virtual == 1:
        return one_f_one_b(stages, micro_batches)
    if micro_batches % stages:
        raise UsageError(
            f"interleaved schedule needs micro-batches ({micro_batches}) to be a multiple of pp ({stages})"
        )
    total = micro_batches * virtual

    def fwd(k: int) -> Step:
        group = k // (stages * virtual)
        chunk = (k % (stages * virtual)) // stages
        return ("F", group * stages + k % stages, chunk)

    def bwd(k: int) -> Step:
        group = k // (stages * virtual)
        chunk = virtual - 1 - (k % (stages * virtual)) // stages
        return ("B", group * stages + k % stages, chunk)

    out = []
    for i in range(stages):
        warm = min((stages - i - 1) * 2 + (virtual - 1) * stages, total)
        order = [fwd(k) for k in range(warm)]
        f, b = warm, 0
        while f < total:
            order.append(fwd(f))
            f += 1
            order.append(bwd(b))
            b += 1
        order += [bwd(k) for k in range(b, total)]
        out.append(order)
    return out
