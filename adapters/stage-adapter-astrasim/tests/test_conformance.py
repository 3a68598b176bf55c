"""The astrasim simulators against STAGE's conformance kit (each skips where its ASTRA-sim binary is not found)."""

from stage_core.testing import assert_simulator, fresh_host, reference_strategies, toy_plugin

from stage_adapter_astrasim import plugin


import pytest


@pytest.mark.parametrize("name", ["astrasim", "astrasim-aware", "astrasim-htsim"])
def test_a_set_finishes_on_every_rank(tmp_path, name):
    host = fresh_host((toy_plugin, "toy"), (reference_strategies, "reference"), (plugin, "astrasim"))
    assert assert_simulator(host, name, tmp_path) > 0
