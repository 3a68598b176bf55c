"""DualPipe (DeepSeek-V3 technical report, 2024, section 3.2.1; deepseek-ai/DualPipe) and its
V-shaped ("cut-in-half") form DualPipeV, as step orders.

DualPipeV:

Each of the p stages holds two chunks placed as a V (stage i: chunks i and 2p - 1 - i). In
its main phase a stage runs the forward of one micro-batch on one chunk overlapped with the
backward of another on its other chunk (a pair step ``(("F", m1, c1), ("B", m2, c2))``): the
expert all-to-alls of one hide behind the other's compute. The phases, per stage r (chunk 0
the descent, chunk 1 the ascent; n micro-batches, n >= 2p):

1. chunk 0 forwards, 2(p - r - 1) of them;
2. r + 1 times: a forward on chunk 0, then one on chunk 1;
3. p - r - 1 times: chunk 1's input-gradient backward (its weight gradients queued), the
   oldest queued weight gradients, a chunk 1 forward;
4. n - 2p + r + 1 times: forward chunk 0 with backward chunk 1 (the last stage's first one
   not overlapped), then forward chunk 1 with backward chunk 0;
5. p - r - 1 times: backward chunk 1, then forward chunk 1 with backward chunk 0;
6. r + 1 times: backward chunk 1 and chunk 0, the second half of them split into B and W;
7. p - r - 1 times: queued weight gradients, then backward chunk 0;
8. the remaining weight gradients.

Backwards in the overlapped pairs are whole (B with no W); the split ones have their W later.

DualPipe: p ranks (p even), the model cut into p chunks, rank r holding chunk r for the
micro-batches fed from the first rank (its chunk 0, the forward direction) and chunk
p - 1 - r for those fed from the last (its chunk 1, the reverse direction): placement
"dual". Half the n micro-batches go each way (0..n/2 - 1 forward, n/2..n - 1 reverse).
Rank r and rank p - 1 - r run the same phases as DualPipeV's stage min(r, p - 1 - r) of a
pipeline of p/2 stages with n/2 micro-batches, with DualPipeV's chunk 0 read as the
direction that enters on r's side (forward for the first half of the ranks, reverse for
the second), as the reference's ``phase ^ is_in_second_half`` does.
"""

from __future__ import annotations

from stage_core.api import UsageError

Step = tuple[str, int, int]


def dualpipe_v(stages: int, micro_batches: int, virtual: int = 2) -> list:
    p, n = stages, micro_batches
    if n < 2 * p:
        raise UsageError(f"--micro-batches {n}: DualPipeV needs at least 2 x pp = {2 * p} micro-batches (its "
                         f"warm-up fills both chunks of every stage)")
    return [_stage(r, p, n) for r in range(p)]


def dualpipe(stages: int, micro_batches: int, chunks: int = 2) -> list:
    p, n = stages, micro_batches
    if p % 2:
        raise UsageError(f"--pp {p}: DualPipe needs an even pp (rank i and rank pp - 1 - i hold the same two chunks, "
                         f"so no rank may be its own mirror); give --pp {p + 1}, or --schedule dualpipev")
    if n % 2 or n < 2 * p:
        raise UsageError(f"--micro-batches {n}: DualPipe needs an even count of at least 2 x pp = {2 * p} (half fed "
                         f"from each end, each half filling the pipeline); give --micro-batches "
                         f"{max(2 * p, n + n % 2)}")
    half, half_n = p // 2, n // 2
    out = []
    for r in range(p):
        second = r >= half  # its own side's direction is the reverse one: DualPipeV's chunks swap
        steps = []
        for step in _stage(min(r, p - 1 - r), half, half_n):
            parts = [(kind, mb + half_n * (chunk ^ second), chunk ^ second)
                     for kind, mb, chunk in (step if isinstance(step[0], tuple) else (step,))]
            steps.append(tuple(parts) if len(parts) == 2 else parts[0])
        out.append(steps)
    return out


def _stage(r: int, p: int, n: int) -> list:
    steps: list = []
    count = {(kind, chunk): 0 for kind in "FBW" for chunk in (0, 1)}
    queued: list[tuple[int, int]] = []  # (micro-batch, chunk) of split backwards whose W is still to run

    def take(kind: str, chunk: int) -> Step:
        mb = count[(kind, chunk)]
        count[(kind, chunk)] += 1
        return (kind, mb, chunk)

    def forward(chunk):
        steps.append(take("F", chunk))

    def backward(chunk, split=False):
        step = take("B", chunk)
        if split:
            queued.append((step[1], chunk))
        steps.append(step)

    def weight():
        if queued:
            mb, chunk = queued.pop(0)
            steps.append(("W", mb, chunk))

    def pair(f_chunk, b_chunk):
        steps.append((take("F", f_chunk), take("B", b_chunk)))

    for _ in range(2 * (p - r - 1)):
        forward(0)
    for _ in range(r + 1):
        forward(0)
        forward(1)
    for _ in range(p - r - 1):
        backward(1, split=True)
        weight()
        forward(1)
    for i in range(n - 2 * p + r + 1):
        if i == 0 and r == p - 1:  # the last stage's first backward follows its own forward: not overlapped
            forward(0)
            backward(1)
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(p - r - 1):
        backward(1)
        pair(1, 0)
    split = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        backward(1, split)
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        backward(0, split)
    for _ in range(p - r - 1):
        weight()
        backward(0, split)
    for _ in range(r + 1):
        weight()
    while queued:
        weight()
    return steps
