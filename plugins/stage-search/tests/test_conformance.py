"""The local executor against STAGE's conformance kit."""

from stage_core.testing import assert_executor, fresh_host

from stage_search import plugin


def test_the_local_executor_runs_every_item_once():
    assert assert_executor(fresh_host((plugin, "search")), "local", {"workers": 2}) == 7
