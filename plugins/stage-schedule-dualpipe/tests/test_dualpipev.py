"""DualPipeV's order: its structure by hand for a small pipeline, and its bubble against the
DualPipe README's formula when replayed with given F, B and W times."""

from __future__ import annotations

import pytest
from stage_core.api import UsageError, order_problem, simulate_order

from stage_schedule_dualpipe import dualpipe_v


def replay(order, p, TF, TB, TW):
    """The step under the papers' cost model (a pair's two parts one after the other: no credit for overlap)."""
    return simulate_order(order, p, TF, TB, TW, placement="v")[0]


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
