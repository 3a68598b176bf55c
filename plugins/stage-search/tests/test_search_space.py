"""The plan space, the fast pipeline model and the Pareto front, against hand-worked cases."""

import numpy as np
import pytest

from stage_core.api import Plan, gpipe, interleaved_1f1b, one_f_one_b
from stage_search import fast
from stage_search.search import pareto, plan_flags
from stage_search.space import Constraints, balanced, enumerate_plans, stage_layers


def test_uneven_stages_only_where_the_layers_do_not_divide():
    # Llama 3 405B at pp16: the embedding and the head weigh a layer each (Llama 3 Table 4's split)
    assert balanced(126, 16) == (7,) + (8,) * 14 + (7,)
    assert stage_layers(126, 16) == balanced(126, 16)
    assert stage_layers(96, 16) is None  # an even split needs no flag


def test_a_small_space_by_hand():
    """4 GPUs, global batch 4, 4 layers, tp 1, cp 1, no ZeRO or recompute choices: pp 1, 2, 4
    (dp 4, 2, 1) x micro-batch sizes that divide 4/dp; interleaving needs pp | m."""
    c = Constraints(tp=1, cp=1, zero=0, recompute="none", schedules=("1f1b", "interleaved"))
    space = enumerate_plans(4, 4, 1024, 4, gpus_per_node=8, constraints=c)
    got = sorted((p.pp, p.dp, p.micro_batch_size, p.micro_batches, p.virtual_stages) for p in space.plans)
    expected = sorted(
        [(1, 4, 1, 1, 1)]  # dp 4: micro-batch size 1 only
        + [(2, 2, b, 2 // b, 1) for b in (1, 2)] + [(2, 2, 1, 2, 2)]  # 4 layers: v2 at pp2, m 2
        + [(4, 1, b, 4 // b, 1) for b in (1, 2, 4)])  # pp4 x v2 would need 8 layers
    assert got == expected
    # v2 at pp2 with m 1 (micro-batch size 2) needs pp | m: refused, with its reason
    assert sum(space.refused.values()) == 1 and "multiple of pp" in next(iter(space.refused))


def test_plans_come_back_from_their_flags():
    from stage_core.api import plan_from_flags

    plan = Plan(tp=8, cp=2, pp=16, dp=8, sp=True, zero=1, recompute="selective", schedule="interleaved",
                virtual_stages=2, micro_batch_size=2, micro_batches=64, seq_len=8192,
                stage_layers=balanced(126, 32))
    assert plan_from_flags(plan_flags(plan)).plan == plan


def test_the_fast_pipeline_of_1f1b_by_hand():
    """pp 2, 2 micro-batches, forward 1, backward 2, messages 0.5, no collectives waiting on
    the sends: stage 1 runs F0 1.5-2.5, B0 -4.5, F1 -5.5, B1 -7.5; stage 0 gets B0's
    gradient at 5 and B1's at 8: (m + pp - 1)(F + B) + 2(pp - 1) x 0.5 = 10."""
    shape = fast._shape(one_f_one_b, 2, 2, 1)
    end = fast._pipeline(shape, np.array([[1.0, 1.0]]), np.array([[2.0, 2.0]]), np.array([0.5]),
                         np.array([False]), 2)
    assert end.tolist() == [[10.0, 7.5]]


@pytest.mark.parametrize("order, vp", [(one_f_one_b, 1), (gpipe, 1), (interleaved_1f1b, 2)])
def test_uniform_stages_take_the_textbook_time(order, vp):
    """Stages of equal work and free messages: 1F1B and GPipe take (m + pp - 1)(F + B), the
    interleaved schedule (m + (pp - 1)/v)(F + B) with F and B per chunk (Narayanan et al. 2021)."""
    pp, m, F, B = 4, 8, 3.0, 5.0
    shape = fast._shape(order, pp, m, vp)
    chunks = pp * vp
    end = fast._pipeline(shape, np.full((1, chunks), F / vp), np.full((1, chunks), B / vp), np.zeros(1),
                         np.array([False]), pp)
    assert end.max() == pytest.approx((m + (pp - 1) / vp) * (F + B))


def test_activations_in_flight_follow_the_schedule():
    """1F1B: stage s holds pp - s micro-batches at its worst; GPipe: all m."""
    act = np.ones((1, 4))
    peak = fast._activation_peak(fast._walk(one_f_one_b, 4, 8, 1), act)
    assert peak.tolist() == [[4, 3, 2, 1]]
    assert fast._activation_peak(fast._walk(gpipe, 4, 8, 1), act).tolist() == [[8, 8, 8, 8]]


def test_pareto_front():
    points = [(10, 5), (20, 3), (15, 6), (30, 3), (5, 9), (25, 1)]
    assert sorted(pareto(points)) == [0, 1, 4, 5]
