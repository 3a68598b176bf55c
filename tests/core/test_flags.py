"""A flag's valid values come from one place (issue 9, point 5): Plan's COUNTS and CHOICES
feed both --help and Plan.check_basic, and the messages name a value that would be valid."""

import pytest


from stage_core.cli import build_parser, main
from stage_core.errors import UsageError
from stage_core.ir.tensor import DTYPE_BYTES
from stage_core.parallel.plan import CHOICES, COUNTS, Plan, divisors, flag
from stage_core.testing import fresh_host, jsonl_plugin, toy_plugin

from conftest import DP


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"))


def help_text(host, command="report"):
    return build_parser(host)._subparsers._group_actions[0].choices[command].format_help()


# a plan in which each value of the field is meaningful (ZeRO needs dp > 1)
CONTEXT = {"zero": {"dp": 2}}


@pytest.mark.parametrize("field", sorted(CHOICES))
def test_help_lists_exactly_what_the_check_accepts(host, field):
    valid = CHOICES[field]
    assert f"{flag(field)} {'|'.join(map(str, valid))}" in help_text(host)
    for value in valid:
        Plan(**CONTEXT.get(field, {}), **{field: value}).check_basic()
    bad = "fp8" if isinstance(valid[0], str) else 9
    with pytest.raises(UsageError, match=f"^{flag(field)} {bad}: valid values are {', '.join(map(str, valid))}$"):
        Plan(**CONTEXT.get(field, {}), **{field: bad}).check_basic()


def test_dtype_flags_name_dtypes_the_core_knows():
    assert set(CHOICES["grad_dtype"]) | set(CHOICES["optimizer_dtype"]) <= set(DTYPE_BYTES)


def test_grad_dtype_fp16_is_in_help_and_accepted(host, capsys):
    # the issue: --grad-dtype fp16 was accepted though --help said bf16|fp32
    assert "--grad-dtype bf16|fp16|fp32" in help_text(host, "generate")
    assert main(["report", "--model", "toy", "--grad-dtype", "fp16", "--json"], host=host) == 0


@pytest.mark.parametrize("field", COUNTS)
def test_counts_are_checked_positive(field):
    with pytest.raises(UsageError, match=f"^{flag(field)} 0: must be a positive integer"):
        Plan(**{field: 0}).check_basic()
    with pytest.raises(UsageError, match=f"^{flag(field)} True: must be a positive integer"):
        Plan(**{field: True}).check_basic()


def test_host_provided_values_are_listed_from_the_host(host):
    text = help_text(host, "generate")
    assert "--schedule 1f1b|gpipe|interleaved" in text  # the core's built-in schedules
    assert "--format jsonl" in text  # the only backend this host has


@pytest.mark.parametrize("argv,line", [
    # the issue: "valid --dp: " with nothing after it, when micro-batch-size is what does not divide
    (["--global-batch", "10", "--micro-batch-size", "3"],
     "--micro-batch-size 3 must divide the global batch 10; valid --micro-batch-size: 1, 2, 5, 10"),
    (["--global-batch", "10", "--dp", "4"],
     "--dp 4: dp x micro-batch-size (4) must divide the global batch 10; valid --dp: 1, 2, 5, 10"),
    (["--global-batch", "12", "--dp", "5", "--micro-batch-size", "2"],
     "--dp 5: dp x micro-batch-size (10) must divide the global batch 12; valid --dp: 1, 2, 3, 6"),
    # a global batch with many divisors: the list is cut, not computed by a loop up to B
    (["--global-batch", str(2**40), "--dp", "3"], "valid --dp: 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, ..."),
    # --model '' ran the default model
    (["--model", ""], "--model '': empty; give a preset name"),
])
def test_batch_and_model_messages_name_a_valid_value(host, capsys, argv, line):
    model = [] if "--model" in argv else ["--model", "toy"]
    status = main(["report", *model, *argv], host=host)
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and line in err, err


def test_divisors_are_exact_and_bounded():
    assert divisors(360) == [d for d in range(1, 361) if 360 % d == 0]
    assert divisors(1) == [1] and divisors(97) == [1, 97]
    big = divisors(2**62, trials=1000)  # no loop up to 2**62: 1000 trials
    assert big[:3] == [1, 2, 4] and big[-1] == 2**62 and all(2**62 % d == 0 for d in big)
