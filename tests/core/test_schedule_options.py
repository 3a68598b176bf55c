"""A schedule's own options (ScheduleSpec.options): flags like a strategy's, the value reaches its
order as a keyword argument, the manifest records it, a schedule option without that schedule and
two records declaring one name are refused in one line."""

from __future__ import annotations

import json

import pytest

from stage_core.api import OptionSpec, PluginError, ScheduleSpec, StrategySpec, hookimpl, main, one_f_one_b
from stage_core.testing import fresh_host, jsonl_plugin, reference_strategies, toy_plugin

SEEN: list = []


class Warm:
    """A third party's schedule: 1F1B whose warm-up it records (the option's value as the order saw it)."""

    @hookimpl
    def stage_schedules(self):
        def order(stages, micro_batches, virtual=1, extra_warmup=0):
            SEEN.append(extra_warmup)
            return one_f_one_b(stages, micro_batches)
        return [ScheduleSpec("warm", order, "1F1B", chunks=1,
                             options=(OptionSpec("extra-warmup", int, 0, "forwards more before the first backward"),))]


class Clash:
    @hookimpl
    def stage_strategies(self):
        return [StrategySpec("clash", None, lambda m, p: [], lambda sg, mesh, plan: sg,
                             options=(OptionSpec("extra-warmup", int, 0, "the same name"),))]


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"), (Warm(), "warm-plugin"))


def test_the_option_is_a_flag_under_its_schedule(host, capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"], host=host)
    out = capsys.readouterr().out
    assert "schedule warm (plugin warm-plugin):" in out and "--extra-warmup" in out


def test_the_order_gets_the_value_and_the_manifest_records_it(host, capsys):
    SEEN.clear()
    assert main(["report", "--model", "toy", "--pp", "2", "--micro-batches", "4", "--schedule", "warm",
                 "--extra-warmup", "3", "--json"], host=host) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["options"] == {"extra-warmup": 3}
    assert SEEN and set(SEEN) == {3}
    SEEN.clear()
    assert main(["report", "--model", "toy", "--pp", "2", "--micro-batches", "4", "--schedule", "warm", "--json"],
                host=host) == 0
    assert "options" not in json.loads(capsys.readouterr().out)["plan"]
    assert set(SEEN) == {0}  # the default, by keyword


def test_a_schedule_option_without_its_schedule_is_one_line(host, capsys):
    assert main(["report", "--model", "toy", "--pp", "2", "--micro-batches", "4", "--extra-warmup", "3"],
                host=host) == 2
    assert capsys.readouterr().err.strip() == (
        "stage: error: --extra-warmup 3: an option of schedule warm; the plan runs --schedule 1f1b (give "
        "--schedule warm, or leave --extra-warmup out)")


def test_one_option_name_declared_twice_names_both():
    host = fresh_host((toy_plugin, "toy"), (Warm(), "warm-plugin"), (Clash(), "clash-plugin"))
    with pytest.raises(PluginError, match=r"option --extra-warmup is declared twice: by 'clash' \(plugin "
                                          r"'clash-plugin'\) and by 'warm' \(plugin 'warm-plugin'\)"):
        host.options()
