"""The astrasim simulator against STAGE's conformance kit (skips where no ASTRA-sim binary is found)."""

from stage_core.testing import assert_simulator, fresh_host, reference_strategies, toy_plugin

from stage_adapter_astrasim import plugin


def test_a_set_finishes_on_every_rank(tmp_path):
    host = fresh_host((toy_plugin, "toy"), (reference_strategies, "reference"), (plugin, "astrasim"))
    assert assert_simulator(host, "astrasim", tmp_path) > 0
