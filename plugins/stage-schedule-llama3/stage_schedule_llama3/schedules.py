"""Llama 3's pipeline schedule (Llama Team, "The Llama 3 Herd of Models", arXiv 2407.21783,
section 3.3.2, Figure 6), as step orders.

The paper's schedule is interleaved 1F1B (Narayanan et al. 2021) with V chunks per pipeline
rank, made flexible in the number of micro-batches M: a rank runs the forwards of N
*contiguous* micro-batches through one chunk, then the same ones through its next chunk,
and so on (a *round*); its backwards likewise, the chunks in reverse.  Megatron's
interleaved schedule is the case N = PP (and needs M to be a multiple of PP);
breadth-first pipelining is N = M.  The paper's bubble ratio is (PP − 1)/(V·M).

Any M works here.  M ≥ N: ⌊M/N⌋ rounds share the M micro-batches, the first ones a
micro-batch more when N does not divide M (every round holds at least N; PyTorch's
flexible interleaved 1F1B shares M over M // PP rounds the same way, but needs them
equal).  M < PP: one round of M (fewer micro-batches than stages, the paper's first use
of the flexibility; each chunk's turn then waits PP − M steps for its data).  N below PP
is refused: a chunk's forward would wait on data still going round the pipeline while
the backwards it waits for wait on it.

Warm-up: rank i runs W_i = (V − 1)·R + 2·(PP − 1 − i) forwards before its first
backward (R: the first round's micro-batches; at most M·V), as the Llama 3 team's
flexible interleaved 1F1B in PyTorch (``torch.distributed.pipelining``) counts it: the
last rank holds the first round's other V − 1 chunks in flight, each rank nearer the
first two steps more; then one forward and one backward alternate, then the remaining
backwards.  With V = 1 the schedule is 1F1B (warm-up PP − 1 − i).
"""

from __future__ import annotations

from stage_core.api import UsageError

Step = tuple[str, int, int]


def rounds(micro_batches: int, size: int) -> list[range]:
    """The micro-batches of each round: ⌊M/N⌋ rounds (at least one), the first ones a
    micro-batch more when N does not divide M."""
    count = max(1, micro_batches // size)
    small, extra = divmod(micro_batches, count)
    out, start = [], 0
    for k in range(count):
        n = small + (k < extra)
        out.append(range(start, start + n))
        start += n
    return out


def forward_sequence(micro_batches: int, virtual: int, size: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in the order every rank runs its forwards: round by round, each
    round's micro-batches through chunk 0, then through chunk 1, ..."""
    return [(m, c) for r in rounds(micro_batches, size) for c in range(virtual) for m in r]


def backward_sequence(micro_batches: int, virtual: int, size: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in the order every rank runs its backwards: round by round, the
    chunks from the last to the first."""
    return [(m, c) for r in rounds(micro_batches, size) for c in reversed(range(virtual)) for m in r]


def warmup(stages: int, stage: int, micro_batches: int, virtual: int, size: int) -> int:
    """Forwards rank ``stage`` runs before its first backward."""
    if virtual == 1:
        return min(stages - 1 - stage, micro_batches)
    first = len(rounds(micro_batches, size)[0])
    return min((virtual - 1) * first + 2 * (stages - 1 - stage), micro_batches * virtual)


def llama3(stages: int, micro_batches: int, virtual: int = 1, round_size: int | None = None) -> list[list[Step]]:
    """Each pipeline rank's steps; ``round_size`` is the paper's N (None: PP)."""
    size = stages if round_size is None else round_size
    if isinstance(size, bool) or not isinstance(size, int) or size < stages:
        raise UsageError(f"--round-size {round_size}: the micro-batches a rank runs through one chunk before the "
                         f"next (Llama 3's N) run from pp (depth-first, Megatron's interleaving) to the "
                         f"micro-batches (breadth-first); give at least --pp {stages}")
    fwd = forward_sequence(micro_batches, virtual, size)
    bwd = backward_sequence(micro_batches, virtual, size)
    out = []
    for i in range(stages):
        warm = warmup(stages, i, micro_batches, virtual, size)
        steps: list[Step] = [("F", m, c) for m, c in fwd[:warm]]
        f = warm
        for m, c in bwd:
            if f < len(fwd):
                steps.append(("F", *fwd[f]))
                f += 1
            steps.append(("B", m, c))
        out.append(steps)
    return out
