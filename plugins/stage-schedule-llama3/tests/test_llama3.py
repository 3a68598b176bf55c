"""Llama 3's schedule: a small order by hand, Megatron's interleaved 1F1B as its N = PP case, the
warm-up rule, and its bubble replayed with given F and B times against the paper's ratio
(PP - 1)/(V·M) (Llama 3, arXiv 2407.21783, section 3.3.2)."""

from __future__ import annotations

import pytest

from stage_core.api import UsageError, interleaved_1f1b, one_f_one_b, order_problem, simulate_order

from stage_schedule_llama3 import llama3
from stage_schedule_llama3.schedules import rounds


def test_three_micro_batches_on_two_stages_by_hand():
    # pp 2, V 2, M 3 (not a multiple of pp): one round of the three; warm-up (V-1)·3 + 2(pp-1-i):
    # 5 forwards on stage 0, 3 on stage 1, then one forward and one backward alternate
    assert llama3(2, 3, 2) == [
        [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 1), ("B", 0, 1), ("B", 1, 1),
         ("B", 2, 1), ("B", 0, 0), ("B", 1, 0), ("B", 2, 0)],
        [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 0, 1), ("B", 0, 1), ("F", 1, 1), ("B", 1, 1), ("F", 2, 1),
         ("B", 2, 1), ("B", 0, 0), ("B", 1, 0), ("B", 2, 0)],
    ]


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 16), (8, 2, 16), (16, 2, 16), (4, 4, 4)])
def test_n_equal_to_pp_is_megatrons_interleaved_1f1b(p, v, m):
    assert llama3(p, m, v) == interleaved_1f1b(p, m, v)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 6), (8, 3)])
def test_one_chunk_is_1f1b(p, m):
    assert llama3(p, m, 1, round_size=p + 1) == one_f_one_b(p, m)


def test_rounds_share_the_micro_batches_and_the_warm_up_follows_the_first():
    # M 10, N 4: two rounds of 5 (at least N each); M 11, N 5: 6 then 5; M 3 < pp 4: one round
    assert [len(r) for r in rounds(10, 4)] == [5, 5]
    assert [len(r) for r in rounds(11, 5)] == [6, 5]
    assert [len(r) for r in rounds(3, 4)] == [3]
    order = llama3(4, 10, 2, round_size=4)
    warm = [next(i for i, s in enumerate(steps) if s[0] == "B") - 1 for steps in order]  # F, then the first B
    assert warm == [5 + 2 * (3 - i) for i in range(4)]  # (V-1)·5 + 2(pp-1-i): 11, 9, 7, 5
    # each rank's forwards: the round's five micro-batches through chunk 0, then through chunk 1
    assert [(m, c) for k, m, c in order[0] if k == "F"][:10] == [(m, 0) for m in range(5)] + [(m, 1) for m in range(5)]


CASES = [(p, v, m, n) for p in (2, 4, 8) for v in (1, 2, 3) for m in (p, p + 1, 2 * p - 1, 2 * p + 3, 4 * p)
         for n in (p, p + 1, 2 * p)]


@pytest.mark.parametrize("tf,tb", [(1.0, 2.0), (1.0, 1.0), (1.0, 3.0)])
@pytest.mark.parametrize("p,v,m,n", CASES)
def test_the_bubble_is_the_papers(p, v, m, n, tf, tb):
    order = llama3(p, m, v, round_size=n)
    assert order_problem(order, p, m, v) is None
    step, idle = simulate_order(order, p, tf, tb, 0.0)
    busy = v * m * (tf + tb)  # every chunk's forward and backward of every micro-batch
    assert max(idle) / busy == pytest.approx((p - 1) / (v * m))  # Llama 3: bubble ratio (PP - 1)/(V·M)
    assert step == pytest.approx(busy + (p - 1) * (tf + tb))


@pytest.mark.parametrize("p,v,m", [(2, 2, 1), (4, 2, 3), (8, 3, 5), (16, 2, 8)])
def test_fewer_micro_batches_than_stages(p, v, m):
    # one round of M < pp: after each of the V - 1 turns a chunk's forward waits pp - M steps for its data
    # (by hand at pp 2, V 2, M 1, F = B = 1: stage 0 runs F, idles 1, F, idles 1, B, idles 1, B: idle 4 =
    # (1 + 1·1)·2)
    step, idle = simulate_order(llama3(p, m, v), p, 1.0, 1.0, 0.0)
    assert max(idle) == pytest.approx(((p - 1) + (v - 1) * (p - m)) * 2.0)


def test_n_below_pp_is_refused_in_one_line():
    with pytest.raises(UsageError, match=r"^--round-size 3: .* give at least --pp 4$"):
        llama3(4, 8, 2, round_size=3)
