"""The zero-bubble orders: by hand for small pipelines, their bubbles against the paper's
formulas (Qi et al. 2024) when replayed with given F, B and W times, and the memory they keep."""

from __future__ import annotations

import pytest

from stage_core.api import simulate_order

from stage_schedule_zerobubble import zb_h1, zb_h2, zb_v


def replay(order, p, TF, TB, TW, placement="loop"):
    """Per stage, the idle time between its first step and its last under the papers' cost model."""
    return simulate_order(order, p, TF, TB, TW, placement)[1]


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
    assert max(replay(one_f_one_b(p, m), p, 1.0, 1.2, 0.8)) == pytest.approx((p - 1) * (1.0 + 1.2 + 0.8))
