"""DualPipeV's order: its structure by hand for a small pipeline, and its bubble against the
DualPipe README's formula when replayed with given F, B and W times."""

from __future__ import annotations

import pytest
from stage_core.api import UsageError, order_problem

from stage_schedule_dualpipe import dualpipe_v


def replay(order, p, TF, TB, TW):
    """Each stage runs its steps in order (a pair's two parts one after the other: no credit for
    overlap); F of a chunk waits for the chunk before it, B for the chunk after and its own F, W for
    its B; a backward with no W of its own is whole (B + W).  Returns the step."""
    def chunk(stage, local):
        return stage if local == 0 else 2 * p - 1 - stage

    def flat(steps):
        return [part for step in steps for part in (step if isinstance(step[0], tuple) else [step])]

    split = [{(m, c) for k, m, c in flat(steps) if k == "W"} for steps in order]
    end, pos, free = {}, [0] * p, [0.0] * p
    left = sum(map(len, order))
    while left:
        moved = False
        for s in range(p):
            if pos[s] == len(order[s]):
                continue
            step = order[s][pos[s]]
            parts = list(step) if isinstance(step[0], tuple) else [step]
            own = {(k, chunk(s, c), m) for k, m, c in parts}
            deps = []
            for k, m, c in parts:
                g = chunk(s, c)
                deps += {"F": [("F", g - 1, m)] if g else [],
                         "B": [("F", g, m)] + ([("B", g + 1, m)] if g < 2 * p - 1 else []),
                         "W": [("B", g, m)]}[k]
            if all(d in end or d in own for d in deps):
                t = max([free[s]] + [end[d] for d in deps if d not in own])
                t += sum(TB + TW if k == "B" and (m, c) not in split[s] else {"F": TF, "B": TB, "W": TW}[k]
                         for k, m, c in parts)
                for k, m, c in parts:
                    end[(k, chunk(s, c), m)] = t
                free[s], pos[s], left, moved = t, pos[s] + 1, left - 1, True
        assert moved, "the orders wait on each other"
    return max(free)


def test_the_first_stage_of_a_two_stage_pipeline_by_hand():
    # p 2, n 4: stage 0 warms up with 2 chunk-0 forwards, a forward on each chunk, then the turn's
    # split backward of chunk 1, then the overlapped pairs; the last two backwards of chunk 0 split
    order = dualpipe_v(2, 4)[0]
    assert order[:6] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 0, 1), ("B", 0, 1), ("W", 0, 1)]
    assert order[6] == ("F", 1, 1)
    assert (("F", 3, 0), ("B", 1, 1)) in order and (("F", 2, 1), ("B", 0, 0)) in order


@pytest.mark.parametrize("p,n", [(2, 4), (4, 8), (4, 16), (8, 16), (8, 32)])
def test_orders_are_well_formed(p, n):
    assert order_problem(dualpipe_v(p, n), p, n, 2) is None


@pytest.mark.parametrize("p,n", [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_bubble_is_the_readmes_with_equal_times(p, n):
    # DualPipe README: (PP/2 - 1)(F&B + B - 3W), PP = 2p chunks, B a whole backward; with F = B_input = W = 1 an
    # overlapped pair takes F + B (no credit for overlap here): (p - 1)(3 + 2 - 3) = 2(p - 1)
    step = replay(dualpipe_v(p, n), p, 1, 1, 1)
    assert step - n * 2 * 3 == (p - 1) * ((1 + 2) + 2 - 3 * 1)


def test_too_few_micro_batches_is_one_line():
    with pytest.raises(UsageError, match="DualPipeV needs at least 2 x pp = 8 micro-batches"):
        dualpipe_v(4, 6)
