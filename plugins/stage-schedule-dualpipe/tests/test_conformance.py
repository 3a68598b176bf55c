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


def test_dualpipe_structure_flops_pipeline_bytes_and_the_replay(tmp_path):
    # (4, 16) besides the kit's (2, 4) and (4, 8); an odd pp or too few micro-batches the order refuses (a UsageError)
    assert assert_schedule_structure(HOST, "dualpipe", cases=((2, 4, 2), (4, 8, 2), (4, 16, 2), (3, 6, 2),
                                                              (4, 6, 2))) == 3
    # rank s carries 1F1B's stage s's messages and matmuls for the half fed from rank 0 and stage p-1-s's for the
    # half fed from the last: with n/2 each way the mean of the two, what the kit asserts under "dual" (equal to
    # 1F1B's per rank when every message is one hidden state, test_dualpipe.test_pipeline_bytes_by_hand)
    rows = assert_schedule_like_1f1b(HOST, "dualpipe", tmp_path, plans=[Plan(pp=2, micro_batches=4),
                                                                      Plan(pp=4, micro_batches=8)])
    assert [r["replay"] for r in rows] == ["finishes", "finishes"]
