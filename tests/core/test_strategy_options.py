"""A strategy's own options: flags from their declarations, the plan and manifest record
them, help and `stage plugins` list them; no environment variables."""

from __future__ import annotations

import json

import pytest

from stage_core.api import OptionSpec, StrategySpec, hookimpl, main, plan_from_settings
from stage_core.testing import fresh_host, jsonl_plugin, toy_plugin

SEEN: list = []


class Overlap:
    """A third party's strategy with two options (it records what apply saw)."""

    @hookimpl
    def stage_strategies(self):
        def apply(sg, mesh, plan):
            SEEN.append((plan.option("chunks", 1), plan.option("eager", False)))
            return sg
        return [StrategySpec("overlap", None, lambda model, plan: [], apply, description="overlap communication",
                             options=(OptionSpec("chunks", int, 1, "pieces per bucket", choices=(1, 2, 4)),
                                      OptionSpec("eager", bool, False, "start early")))]


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (Overlap(), "overlap-plugin"))


def test_options_become_flags_listed_in_help_under_their_strategy(host, capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"], host=host)
    out = capsys.readouterr().out
    assert "strategy overlap (plugin overlap-plugin):" in out
    assert "--chunks 1|2|4" in out and "pieces per bucket (default 1)" in out
    assert "--eager, --no-eager" in out


def test_the_plan_the_strategy_and_the_manifest_see_the_option(host, capsys):
    SEEN.clear()
    assert main(["report", "--model", "toy", "--chunks", "4", "--eager", "--json"], host=host) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["plan"]["options"] == {"chunks": 4, "eager": True}
    assert SEEN == [(4, True)]
    SEEN.clear()
    assert main(["report", "--model", "toy", "--json"], host=host) == 0
    assert "options" not in json.loads(capsys.readouterr().out)["plan"]  # defaults are not recorded
    assert SEEN == [(1, False)]


def test_settings_take_options_like_any_flag(host):
    plan = plan_from_settings({"model": "toy", "chunks": 2}, host).plan
    assert plan.options == (("chunks", 2),) and plan.option("chunks") == 2
    assert plan != plan_from_settings({"model": "toy"}, host).plan  # anything keyed on the plan sees it
    with pytest.raises(Exception, match="unknown setting 'chunk'"):
        plan_from_settings({"model": "toy", "chunk": 2}, host)


def test_a_bad_option_value_is_one_line(host, capsys):
    assert main(["report", "--model", "toy", "--chunks", "3"], host=host) == 2
    assert capsys.readouterr().err.strip() == ("stage: error: stage report: argument --chunks: invalid choice: 3 "
                                               "(choose from 1, 2, 4) (see stage report --help)")


def test_stage_plugins_lists_the_options(host, capsys):
    assert main(["plugins", "--json"], host=host) == 0
    info = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert info["overlap-plugin"]["provides"] == {"options": ["--chunks", "--eager"], "strategies": ["overlap"]}
