import pytest

from stage_core.testing import fresh_host, jsonl_plugin, reference_strategies, toy_plugin
from stage_dataset import plugin, unit

from support import Support


@pytest.fixture
def host(monkeypatch):
    """The toy model, reference dp and pp, the jsonl format, and Support; units see this host."""
    h = fresh_host((toy_plugin, "toy"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"),
                   (Support(), "support"), (plugin, "dataset"))
    monkeypatch.setattr(unit, "_host", lambda: h)
    return h
