import pytest

from stage_core.testing import fresh_host, toy_plugin
from stage_search import units


@pytest.fixture
def toy_host(monkeypatch):
    """Sweeps see the core's toy model (this distribution's tests install no model plugin)."""
    from stage_search import plugin

    host = fresh_host((toy_plugin, "toy"), (plugin, "search"))
    monkeypatch.setattr(units, "_host", lambda: host)
    return host

