"""The built-in published plans: their flags parse, and their sizes are the published ones."""

import pytest

from stage_core.cli import build_parser, plan_from_args
from stage_parallel.plans import builtin_plans

PLANS = {p.name: p for p in builtin_plans()}


@pytest.mark.parametrize("name,gpus,tokens_per_step", [
    ("llama3-405b-8k-gpus", 8192, 2048 * 8192),    # Llama 3 Table 4: 16M tokens per batch
    ("llama3-405b-16k-gpus", 16384, 2048 * 8192),
    ("llama3-405b-16k-gpus-128k", 16384, 128 * 131072),
    ("gpt3-175b-megatron", 1024, 1536 * 2048),      # Megatron's GPT-3 175B: 1,536 x 2,048
])
def test_published_plans_parse_with_their_world_size_and_batch(name, gpus, tokens_per_step):
    spec = PLANS[name]
    args = build_parser(None).parse_args(["report", *spec.flags()])
    _, _, plan, _ = plan_from_args(args)
    assert plan.world_size == spec.world_size == gpus
    assert plan.global_batch * plan.seq_len == tokens_per_step
