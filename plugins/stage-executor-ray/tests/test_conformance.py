"""The ray executor against STAGE's conformance kit (needs Ray: the plugin's `ray` extra)."""

import pytest
from stage_core.testing import assert_executor, fresh_host

from stage_executor_ray import plugin


def test_runs_every_item_once():
    pytest.importorskip("ray", reason="Ray is the plugin's `ray` extra")
    assert assert_executor(fresh_host((plugin, "executor-ray")), "ray", {"workers": 2}) == 7
