"""The ray executor runs a function over items as Ray tasks on a local instance."""

import math

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed")

from stage_core.api import PluginHost


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_the_host_finds_the_ray_executor_through_its_entry_point():
    spec = PluginHost().executor("ray")
    assert spec.plugin == "executor-ray"


def test_every_item_runs_once_and_comes_back_with_its_index(local_ray):
    # a function Ray workers can import (a test module's own functions they cannot)
    items = list(range(1, 61))
    got = dict(PluginHost().executor("ray").run(math.factorial, items, {}))
    assert got[19] == 2_432_902_008_176_640_000  # 20!, OEIS A000142
    assert got[0] == 1 and got[9] == 3_628_800  # 1!, 10!
    assert sorted(got) == list(range(60))
