"""Both backends against STAGE's conformance kit: written sets read back node for node and validate."""

import pytest
from stage_core.testing import assert_backend_round_trip, fresh_host, reference_strategies, toy_plugin

from stage_adapter_chakra import plugin


@pytest.mark.parametrize("backend", ["chakra", "chakra-json"])
def test_round_trip(backend, tmp_path):
    host = fresh_host((toy_plugin, "toy"), (reference_strategies, "reference"), (plugin, "chakra"))
    assert assert_backend_round_trip(host, backend, tmp_path) == 2 + 2  # dp 2 and pp 2 ranks
