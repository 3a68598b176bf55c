"""The plugin as the host finds it: through its entry point, its two commands."""

from stage_core.api import PluginHost


def test_the_host_finds_both_commands_through_the_entry_point():
    host = PluginHost()
    mine = {c.name: c.plugin for c in host.commands() if c.name in ("dataset", "from-dag")}
    assert mine == {"dataset": "dataset", "from-dag": "dataset"}
    assert host.dists["dataset"] == "stage-dataset"
