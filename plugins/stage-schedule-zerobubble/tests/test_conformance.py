"""The three schedules against STAGE's conformance kit (the core alone, the kit's toy model)."""

import pytest
from stage_core.testing import (assert_schedule_like_1f1b, assert_schedule_structure, fresh_host, jsonl_plugin,
                                reference_strategies, toy_plugin)

from stage_schedule_zerobubble import plugin

HOST = fresh_host((plugin, "zerobubble"), (toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"))


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2", "zb-v"])
def test_structure_flops_and_the_replay(name, tmp_path):
    assert assert_schedule_structure(HOST, name) >= 2
    rows = assert_schedule_like_1f1b(HOST, name, tmp_path)
    assert [r["replay"] for r in rows] == ["finishes"] * len(rows)

