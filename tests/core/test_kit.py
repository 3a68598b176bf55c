"""The conformance kit (stage_core.testing) on the toy model, with the core alone: each
check passes where the numbers come out as computed by hand, and fails, saying why, where
they do not."""

from __future__ import annotations

import pytest

from stage_core.api import Plan, StrategySpec, hookimpl
from stage_core.testing import (assert_backend_round_trip, assert_config_round_trips, assert_flops_conserved,
                                assert_forward_flops, assert_param_count, assert_schedule_like_1f1b,
                                assert_schedule_structure, assert_strategy_conserves, assert_tasks,
                                assert_tp_shards_or_warns, fresh_host, jsonl_plugin, reference_strategies,
                                toy_plugin)

# the toy model: L = 2 layers, h = 64, 4 heads, FFN 256, vocabulary 128 (tied), sequence 32
L, H, F, V, S = 2, 64, 256, 128, 32


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "reference"))


def test_parameter_count_by_hand(host):
    # per layer 12h^2 + 13h (QKV and output projection with biases, two layer norms, a 4h GeLU MLP with biases),
    # the tied table V h, the final norm 2h
    assert_parameter = L * (12 * H * H + 13 * H) + V * H + 2 * H
    assert_param_count(host, "toy", assert_parameter)
    with pytest.raises(AssertionError, match=r"toy: 108,288 parameters, expected 108,289 \(-1\)"):
        assert_param_count(host, "toy", assert_parameter + 1)


def test_forward_flops_by_narayanans_formula(host):
    # Narayanan et al. 2021: 72 B s L h^2 (1 + s/6h + V/12hL) for forward and backward, 3x the forward
    forward = 24 * S * L * H * H * (12 * H * L + 2 * S * L + V) // (12 * H * L)
    assert forward == 7_340_032
    assert_forward_flops(host, "toy", forward)
    with pytest.raises(AssertionError, match="forward matmul_flops 7,340,032, expected 1"):
        assert_forward_flops(host, "toy", 1)


def test_configs_round_trip(host):
    assert_config_round_trips(host, "toy")


def test_flops_are_conserved_over_the_matrix_the_host_allows(host):
    # the reference strategies give the matrix's dp and pp plans: dp 1/2 x m 1/2, and 3 schedules x dp 1/2 at pp 2
    assert assert_flops_conserved(host, "toy") == 10


class Duplicating:
    """A broken strategy: splits the batch over dp in forward, but every rank still runs the
    whole batch (it declares nothing, and the plan's dp doubles the graph's batch)."""

    @hookimpl
    def stage_strategies(self):
        return [StrategySpec("dp", "dp", lambda model, plan: [], lambda sg, mesh, plan: sg)]


def test_the_check_catches_a_strategy_that_computes_twice():
    broken = fresh_host((toy_plugin, "toy"), (Duplicating(), "dup"))
    # one device: 3 x the forward (7,340,032 per sequence) for the job's 2 sequences; each rank runs both
    with pytest.raises(AssertionError, match=r"toy dp2-tp1-pp1-z0-none-m1: ranks compute 88,080,384 matmul FLOPs, "
                                             r"one device 44,040,192"):
        assert_flops_conserved(broken, "toy", plans=[Plan(dp=2)])


def test_every_task_works_or_refuses_in_one_line(host):
    assert assert_tasks(host, "toy") == {"train": "ok", "prefill": "ok", "decode": "ok"}


class IdleTensorParallel:
    @hookimpl
    def stage_strategies(self):
        return [StrategySpec("tp", "tp", lambda model, plan: [], lambda sg, mesh, plan: sg)]


def test_a_tp_that_shards_nothing_is_warned_about():
    idle = fresh_host((toy_plugin, "toy"), (IdleTensorParallel(), "idle"))
    assert assert_tp_shards_or_warns(idle, "toy") == "warned"


def test_the_builtin_schedules_pass_the_structure_check(host):
    assert assert_schedule_structure(host, "1f1b") == 6  # the cases of one chunk
    assert assert_schedule_structure(host, "interleaved") >= 6


def test_gpipe_is_like_1f1b_and_finishes(host, tmp_path):
    rows = assert_schedule_like_1f1b(host, "gpipe", tmp_path)
    assert [r["replay"] for r in rows] == ["finishes", "finishes"]


def test_a_strategy_conserves_with_and_without_it(host):
    assert assert_strategy_conserves(host, "dp") == 10


def test_the_jsonl_backend_round_trips(host, tmp_path):
    assert assert_backend_round_trip(host, "jsonl", tmp_path) == 2 + 2  # dp 2 and pp 2 (no tp strategy here)
