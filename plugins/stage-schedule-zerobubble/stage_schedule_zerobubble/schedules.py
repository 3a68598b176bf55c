"""The zero-bubble schedules of Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024;
arXiv 2401.10241), as step orders: F (forward), B (the input gradients) and W (the weight
gradients, deferred into what would be bubbles).

* ZB-H1 (section 2.1): 1F1B's forwards, each stage's W passes started later the further
  down the pipeline it is (stage i runs W of micro-batch k after B of micro-batch k + i), so
  every stage has p micro-batches between F and W and the first stage holds what 1F1B's
  does; bubble (p - 1)(T_F + T_B - T_W).
* ZB-H2 (section 2.2): more forwards in warm-up (up to 2p - 1 micro-batches between F and W
  on every stage), B as soon as it can run, then F, W filling the rest; bubble
  (p - 1)(T_F + T_B - 2 T_W) when positive, peak memory (2p - 1) micro-batches.
* ZB-V (section 6): two chunks per stage placed as a V (stage i holds chunks i and
  2p - 1 - i), warm-up, a steady phase of F, B, W on each chunk in turn, and a cool-down
  whose W passes fill the tail; zero bubble when T_F = T_B = T_W, with 1F1B's memory.

ZB-H2's order is what the paper's rule gives with equal F, B and W times (a list schedule:
at each free moment a stage runs a B it can, else an F if fewer than 2p - 1 micro-batches
are between F and W, else its oldest W); a written order is a fixed sequence per stage,
which the traces then time.
"""

from __future__ import annotations

Step = tuple[str, int, int]


def zb_h1(stages: int, micro_batches: int, virtual: int = 1) -> list[list[Step]]:
    p, m = stages, micro_batches
    out = []
    for i in range(p):
        warm = min(p - i - 1, m)
        steps: list[Step] = [("F", k, 0) for k in range(warm)]
        forwards = warm
        for k in range(m):
            if forwards < m:
                steps.append(("F", forwards, 0))
                forwards += 1
            steps.append(("B", k, 0))
            if k >= i:  # W lags B by i micro-batches: the later stages' idle tail fills with W
                steps.append(("W", k - i, 0))
        steps += [("W", k, 0) for k in range(max(m - i, 0), m)]
        out.append(steps)
    return out


def zb_h2(stages: int, micro_batches: int, virtual: int = 1) -> list[list[Step]]:
    p, m = stages, micro_batches
    cap = 2 * p - 1  # micro-batches between a stage's F and its W
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, micro-batch) -> when it ends (unit times)
    order: list[list[Step]] = [[] for _ in range(p)]
    free = [0] * p
    forward = [0] * p
    waiting_b: list[list[int]] = [[] for _ in range(p)]  # F done, B not
    waiting_w: list[list[int]] = [[] for _ in range(p)]  # B done, W not
    t, left = 0, 3 * m * p
    while left:
        for i in range(p):
            if free[i] > t:
                continue
            ready_b = next((k for k in waiting_b[i] if i == p - 1 or done.get(("B", i + 1, k), t + 1) <= t), None)
            k = forward[i]
            ready_f = (k < m and (i == 0 or done.get(("F", i - 1, k), t + 1) <= t)
                       and len(waiting_b[i]) + len(waiting_w[i]) < cap)
            if ready_b is not None:
                kind, k = "B", ready_b
                waiting_b[i].remove(k)
                waiting_w[i].append(k)
            elif ready_f:
                kind = "F"
                forward[i] += 1
                waiting_b[i].append(k)
            elif waiting_w[i]:
                kind, k = "W", waiting_w[i].pop(0)
            else:
                continue
            order[i].append((kind, k, 0))
            done[(kind, i, k)] = t + 1
            free[i] = t + 1
            left -= 1
        t += 1
    return order


def zb_v(stages: int, micro_batches: int, virtual: int = 2) -> list[list[Step]]:
    """Local chunk 0 is model chunk i, local chunk 1 is model chunk 2p - 1 - i (placement "v")."""
    p, m = stages, micro_batches
    n = max(2 * p - 1, m)  # the phases assume enough micro-batches; steps past m are dropped
    out = []
    for r in range(p):
        steps: list[Step] = []
        f = [0, 0]
        b = [0, 0]

        def step(kind, chunk, count):
            steps.append((kind, count[chunk], chunk))
            count[chunk] += 1

        w = [0, 0]
        for _ in range(2 * (p - r) - 1):  # chunk 0's forwards fill the V's descent
            step("F", 0, f)
        for _ in range(r):
            step("F", 1, f)
            step("F", 0, f)
        for _ in range(p - r):  # the turn: chunk 1 forward, its input and weight gradients
            step("F", 1, f)
            step("B", 1, b)
            step("W", 1, w)
        while f[1] < f[0] or f[0] < n:  # steady: F, B, W on each chunk in turn
            if f[0] < n:
                step("F", 0, f)
            step("B", 0, b)
            step("W", 0, w)
            step("F", 1, f)
            step("B", 1, b)
            step("W", 1, w)
        for _ in range(r):  # cool-down: the input gradients first, weight gradients fill the tail
            step("B", 0, b)
            step("B", 1, b)
        for _ in range(p - r):
            step("B", 0, b)
            step("W", 0, w)
        while w[1] < b[1]:
            step("W", 1, w)
        while w[0] < b[0]:
            step("W", 0, w)
        out.append([s for s in steps if s[1] < m])
    return out
