"""The plugin is listed with its option and axis, and its option changes the plan (the kit)."""

from stage_core.api import main
from stage_core.testing import fresh_host, jsonl_plugin, reference_strategies, toy_plugin

from stage_strategy_hsdp import plugin


def test_listed_with_its_option(capsys):
    host = fresh_host((plugin, "hsdp"), (toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"))
    assert main(["plugins"], host=host) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("hsdp "))
    assert "options: --shard-group" in line and "strategies: hsdp" in line
