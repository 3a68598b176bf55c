"""DualPipeV against STAGE's conformance kit (the core alone, the kit's toy model)."""

from stage_core.api import Plan
from stage_core.testing import (assert_schedule_like_1f1b, assert_schedule_structure, fresh_host, jsonl_plugin,
                                reference_strategies, toy_plugin)

from stage_schedule_dualpipe import plugin

HOST = fresh_host((plugin, "dualpipe"), (toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"))


def test_structure_flops_and_the_replay(tmp_path):
    assert assert_schedule_structure(HOST, "dualpipev", cases=((2, 4, 2), (4, 8, 2), (4, 16, 2))) == 3
    rows = assert_schedule_like_1f1b(HOST, "dualpipev", tmp_path, plans=[Plan(pp=2, micro_batches=4),
                                                                       Plan(pp=4, micro_batches=8)])
    assert [r["replay"] for r in rows] == ["finishes", "finishes"]
