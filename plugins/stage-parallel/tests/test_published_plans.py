"""The built-in published plans: their flags parse, and their sizes are the published ones."""

import pytest

from stage_core.api import plan_from_flags
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
    plan = plan_from_flags(spec.flags()).plan
    assert plan.world_size == spec.world_size == gpus
    assert plan.global_batch * plan.seq_len == tokens_per_step
