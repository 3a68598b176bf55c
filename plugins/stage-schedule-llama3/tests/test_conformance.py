"""The schedule against STAGE's conformance kit (the core alone, the kit's toy model): its
structure with and without the option N, the same FLOPs and pipeline bytes as (interleaved)
1F1B, every set finishing in the replay and, where one is installed, in a simulator."""

from stage_core.api import Plan
from stage_core.testing import (SCHEDULE_CASES, assert_schedule_like_1f1b, assert_schedule_structure, fresh_host,
                                jsonl_plugin, reference_strategies, toy_plugin)

from stage_schedule_llama3 import plugin

HOST = fresh_host((plugin, "llama3"), (toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"))


def test_structure():
    cases = SCHEDULE_CASES + ((4, 6, 2), (4, 3, 2), (4, 10, 3), (8, 12, 2))  # M not a multiple of pp, M < pp
    assert assert_schedule_structure(HOST, "llama3", cases) == len(cases)
    assert assert_schedule_structure(HOST, "llama3", cases, options={"round_size": 5}) >= 6


def test_like_1f1b_and_finishing(tmp_path):
    plans = [Plan(pp=2, micro_batches=4), Plan(pp=4, micro_batches=8, virtual_stages=2),
             Plan(pp=4, micro_batches=6, virtual_stages=2),  # not a multiple of pp: interleaved 1F1B cannot
             Plan(pp=4, micro_batches=10, virtual_stages=2).with_options(round_size=5)]  # the paper's N = 5
    rows = assert_schedule_like_1f1b(HOST, "llama3", tmp_path, plans=plans)
    assert [r["replay"] for r in rows] == ["finishes"] * 4
