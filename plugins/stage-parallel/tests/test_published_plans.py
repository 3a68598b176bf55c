"""The built-in published plans: their flags parse, and their sizes are the published ones."""

import pytest

import stage_parallel.plugin as parallel
from stage_core.api import plan_from_flags
from stage_core.testing import fresh_host
from stage_parallel.plans import builtin_plans

PLANS = {p.name: p for p in builtin_plans()}
HOST = fresh_host((parallel, "parallel"))  # the zero strategy's option --no-zero-reshard


@pytest.mark.parametrize("name,gpus,tokens_per_step", [
    ("llama3-405b-8k-gpus", 8192, 2048 * 8192),    # Llama 3 Table 4: 16M tokens per batch
    ("llama3-405b-16k-gpus", 16384, 2048 * 8192),
    ("llama3-405b-16k-gpus-128k", 16384, 128 * 131072),
    ("gpt3-175b-megatron", 1024, 1536 * 2048),      # Megatron's GPT-3 175B: 1,536 x 2,048
])
def test_published_plans_parse_with_their_world_size_and_batch(name, gpus, tokens_per_step):
    spec = PLANS[name]
    plan = plan_from_flags(spec.flags(), HOST).plan
    assert plan.world_size == spec.world_size == gpus
    assert plan.global_batch * plan.seq_len == tokens_per_step


@pytest.mark.parametrize("name", ["llama3-405b-8k-gpus", "llama3-405b-16k-gpus", "llama3-405b-16k-gpus-128k"])
def test_llama3_plans_run_as_the_paper_did(name):
    # section 3.3.2: its interleaved schedule, one layer fewer on the first and last stage (the first chunk
    # the embedding alone, the last the head alone: 126 + 2 = 16 stages x 8 one-layer chunks), FSDP that does
    # not reshard weights after forward
    plan = plan_from_flags(PLANS[name].flags(), HOST).plan
    assert (plan.schedule, plan.pp, plan.virtual_stages) == ("llama3", 16, 8)
    assert plan.stage_layers == (0,) + (1,) * 126 + (0,)
    assert plan.zero == 3 and plan.option("zero-reshard") is False
    assert "not followed" not in PLANS[name].description
