"""Inputs are checked, not defaulted, and bounded before any work (issue 26, points 3 and 4):
each case was a default taken silently, a traceback, or work without end."""

import time

import pytest

from stage_core.cli import main
from stage_core.testing import fresh_host, reference_strategies, toy_plugin


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (reference_strategies, "reference"))


def one_line(host, capsys, *argv):
    started = time.perf_counter()
    status = main(list(argv), host=host)
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert time.perf_counter() - started < 10  # refused before any work
    return err


@pytest.mark.parametrize("flag", ["--prefill-plan", "--decode-plan"])
def test_a_key_given_twice_in_a_side_plan_is_refused(host, capsys, flag):
    # the last one won: dp=1,dp=2 ran dp 2
    err = one_line(host, capsys, "report", "--model", "toy", "--task", "serve", "--prefill-ranks", "2",
                   "--decode-ranks", "2", "--seq-len", "8", flag, "dp=1,dp=2")
    assert f"{flag} dp=1,dp=2: dp is given twice; give each key once" in err


def test_serve_above_the_world_limit_is_refused_before_laying_out_ranks(host, capsys):
    # 2,000,000 ranks ran for minutes and out of memory
    err = one_line(host, capsys, "report", "--model", "toy", "--task", "serve", "--prefill-ranks", "1000000",
                   "--decode-ranks", "1000000", "--seq-len", "8")
    assert "--prefill-ranks 1,000,000 + --decode-ranks 1,000,000 = 2,000,000 ranks, above the 1,048,576" in err


@pytest.mark.parametrize("value", ["inf", "nan", "0.0", "-1.0"])
def test_a_capacity_factor_that_means_nothing_is_refused(host, capsys, value):
    # inf was a traceback (Fraction('inf')), nan and 0 were refused already
    err = one_line(host, capsys, "report", "--model", "toy", "--moe-capacity-factor", value)
    assert f"--moe-capacity-factor {value}: must be a positive finite number" in err


def test_the_serve_side_plans_still_run(host, capsys):
    assert main(["report", "--model", "toy", "--task", "serve", "--prefill-ranks", "2", "--decode-ranks", "2",
                 "--seq-len", "8", "--prefill-plan", "dp=2", "--decode-plan", "micro-batches=2"], host=host) == 0
    assert "KV cache transfer: 2 requests" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["--plan", ""], "--plan '': empty; give a plan name"),  # it was ignored
    (["--global-batch", "0"], "--global-batch 0: must be a positive integer"),  # 0 was the default
    (["--seq-len", "0"], "--seq-len 0: must be a positive integer"),
    (["--micro-batches", "0"], "--micro-batches 0: must be a positive integer"),
])
def test_a_value_that_means_nothing_is_never_the_default(host, capsys, argv, needle):
    assert needle in one_line(host, capsys, "report", "--model", "toy", *argv)
