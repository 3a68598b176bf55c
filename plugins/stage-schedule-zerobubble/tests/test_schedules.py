"""The zero-bubble orders: by hand for small pipelines, their bubbles against the paper's
formulas (Qi et al. 2024) when replayed with given F, B and W times, and the memory they keep."""

from __future__ import annotations

import pytest

from stage_schedule_zerobubble import zb_h1, zb_h2, zb_v


def replay(order, p, TF, TB, TW, placement="loop"):
    """Each stage runs its steps in order; F of a chunk waits for the chunk before it, B for the
    chunk after it (the last chunk for its own F), W for its B.  Returns per stage the idle time
    between its first step's start and its last step's end (the bubble)."""
    chunks = 2 * p if placement == "v" else p

    def chunk(stage, local):
        return stage if local == 0 else 2 * p - 1 - stage

    dur = {"F": TF, "B": TB, "W": TW}
    end, start, pos, free = {}, {}, [0] * p, [0.0] * p
    left = sum(map(len, order))
    while left:
        moved = False
        for s in range(p):
            if pos[s] == len(order[s]):
                continue
            kind, mb, local = order[s][pos[s]]
            c = chunk(s, local)
            deps = {"F": [("F", c - 1, mb)] if c else [],
                    "B": [("F", c, mb)] + ([("B", c + 1, mb)] if c < chunks - 1 else []),
                    "W": [("B", c, mb)]}[kind]
            if all(d in end for d in deps):
                t = max([free[s]] + [end[d] for d in deps])
                start[(kind, c, mb)], end[(kind, c, mb)] = t, t + dur[kind]
                free[s], pos[s], left, moved = t + dur[kind], pos[s] + 1, left - 1, True
        assert moved, "the orders wait on each other"
    idle = []
    for s in range(p):
        mine = [k for k in end if (k[1] if placement == "loop" else (k[1] if k[1] < p else 2 * p - 1 - k[1])) == s]
        idle.append(max(end[k] for k in mine) - min(start[k] for k in mine) - sum(dur[k[0]] for k in mine))
    return idle


def in_flight(order):
    """Per stage, the most micro-batches (chunks) between their F and their W."""
    out = []
    for steps in order:
        live = peak = 0
        for kind, _, _ in steps:
            live += {"F": 1, "B": 0, "W": -1}[kind]
            peak = max(peak, live)
        out.append(peak)
    return out


def test_zb_h1_by_hand():
    # p 2, m 3: the first stage warms up with one forward and runs W right after each B; the
    # last stage runs W one micro-batch behind its B
    assert zb_h1(2, 3) == [
        [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("W", 0, 0), ("F", 2, 0), ("B", 1, 0), ("W", 1, 0), ("B", 2, 0),
         ("W", 2, 0)],
        [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0), ("W", 0, 0), ("F", 2, 0), ("B", 2, 0), ("W", 1, 0),
         ("W", 2, 0)],
    ]


TIMES = [(1, 1, 1), (1.0, 1.2, 0.8), (1.0, 1.5, 0.5)]
PIPES = [(4, 8), (4, 16), (8, 16), (8, 32)]


@pytest.mark.parametrize("p,m", PIPES)
@pytest.mark.parametrize("TF,TB,TW", TIMES)
def test_zb_h1_bubble_and_memory_are_the_papers(p, m, TF, TB, TW):
    assert max(replay(zb_h1(p, m), p, TF, TB, TW)) == pytest.approx((p - 1) * (TF + TB - TW))
    assert in_flight(zb_h1(p, m)) == [p] * p  # "the same number of in-flight microbatches" on every stage


@pytest.mark.parametrize("p,m", PIPES)
@pytest.mark.parametrize("TF,TB,TW", TIMES + [(1.0, 0.8, 1.2)])
def test_zb_h2_bubble_and_memory_are_the_papers(p, m, TF, TB, TW):
    assert max(replay(zb_h2(p, m), p, TF, TB, TW)) == pytest.approx(max(0.0, (p - 1) * (TF + TB - 2 * TW)))
    assert in_flight(zb_h2(p, m))[0] == 2 * p - 1  # (2p - 1) M_B on the first stage


@pytest.mark.parametrize("p,m", PIPES)
def test_zb_v_has_no_bubble_with_equal_times_and_1f1bs_memory(p, m):
    assert max(replay(zb_v(p, m), p, 1, 1, 1, placement="v")) == 0
    # 2p chunks of half a stage each: what 1F1B's first stage holds (p micro-batches of a stage)
    assert max(in_flight(zb_v(p, m))) == 2 * p


def test_the_1f1b_reference_bubble_is_the_papers():
    # 1F1B with a whole backward (B + W in one step): (p - 1)(T_F + T_B + T_W)
    from stage_core.api import one_f_one_b

    p, m = 4, 8
    merged = [[(k, mb, c) for k, mb, c in steps] for steps in one_f_one_b(p, m)]
    assert max(replay(merged, p, 1.0, 1.2 + 0.8, 0)) == pytest.approx((p - 1) * (1.0 + 1.2 + 0.8))
