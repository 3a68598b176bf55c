"""Trace sets in the real ASTRA-sim: every rank must print "finished".

The simulator exits 0 even when ranks deadlock, so these tests read its output
(through `stage astrasim`'s parser) and require a finish line for every rank and a
positive step time; `stage validate`'s replay must say the same (test_differential
gives both sets that do not finish).  Every plan of the strategy matrix runs, on the
toy model (the simulator needs at least 2 ranks), and MoE plans with tiny shapes.
"""

import pytest

from stage_core.flow import plan_job, write_trace_set
from stage_core.parallel import Plan
from stage_core.testing import matrix_overrides, plan_id, strategy_matrix

# Plans that deadlocked before sends and collectives were chained (issue 8): GPT's tied
# embedding sums its gradients over the first and last stage, and that all-reduce took
# the last stage's one communication slot before its final backward send.
TIED_PIPELINES = [
    ("gpt2", Plan(pp=4, micro_batches=4, schedule="gpipe"), {}),
    ("gpt2", Plan(pp=4, micro_batches=4, schedule="1f1b"), {}),
    ("gpt2", Plan(pp=2, tp=2, micro_batches=4, schedule="interleaved", virtual_stages=2), {}),
    ("gpt2", Plan(pp=2, tp=2, sp=True, micro_batches=4, schedule="interleaved", virtual_stages=2,
                  recompute="full"), {}),
    ("gpt2", Plan(pp=4, dp=2, zero=1, micro_batches=4, schedule="1f1b", recompute="selective"), {}),
    ("gpt2", Plan(pp=2, dp=2, zero=3, micro_batches=2, schedule="gpipe"), {}),
    ("gpt2", Plan(pp=2, dp=4, micro_batches=4, schedule="interleaved", virtual_stages=2), {}),
    ("gpt3-175b", Plan(pp=4, tp=2, micro_batches=4, seq_len=256), {"layers": 8}),
    # uneven stages: gpt2's 12 layers as given, and balanced (auto) over 5 stages
    ("gpt2", Plan(pp=3, micro_batches=4, stage_layers=(3, 5, 4)), {}),
    ("gpt2", Plan(pp=5, micro_batches=5, stage_layers="auto"), {}),
    ("gpt2", Plan(pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2, stage_layers=(2, 4, 4, 2)), {}),
]


@pytest.mark.parametrize("model,plan,overrides", TIED_PIPELINES,
                         ids=lambda x: x if isinstance(x, str) else None)
def test_tied_embedding_pipelines_finish_on_every_rank(write_set, replay_and_simulate, model, plan,
                                                       overrides):
    finishes(replay_and_simulate(write_set(model, plan, **overrides)), plan.world_size)


def finishes(outcome, world_size):
    """Every rank printed "finished", in a positive time; the replay agreed (fixture)."""
    verdict, status, results = outcome
    summary = results["summary"]
    assert summary["deadlocked_ranks"] == [], summary
    assert summary["finished_ranks"] == world_size
    assert status == 0
    assert summary["max_finish_time_ns"] > 0
    assert verdict.finishes and verdict.timing_independent


# Context parallel under each algorithm, with the other axes around it: the ring's sends and
# receives sit inside attention, chained with every other send and collective of the rank.
CONTEXT_PARALLEL = [
    ("llama-tiny", Plan(cp=4, tp=2, sp=True, dp=2, cp_comm="p2p", micro_batches=2), {}),
    ("llama-tiny", Plan(cp=2, tp=2, sp=True, dp=2, pp=2, zero=3, cp_comm="p2p", micro_batches=4,
                        stage_layers="auto"), {"layers": 3}),
    ("llama-tiny", Plan(cp=4, tp=2, sp=True, dp=2, pp=2, zero=1, cp_comm="all-gather", micro_batches=4), {}),
    ("llama-tiny", Plan(cp=2, tp=2, sp=True, dp=2, pp=2, cp_comm="a2a", micro_batches=4, schedule="interleaved",
                        virtual_stages=2), {"kv_heads": 4, "layers": 4}),
    ("gpt2", Plan(cp=2, pp=2, cp_comm="p2p", recompute="selective", micro_batches=2, seq_len=256), {}),
]


@pytest.mark.parametrize("model,plan,overrides", CONTEXT_PARALLEL,
                         ids=lambda x: x if isinstance(x, str) else None)
def test_context_parallel_sets_finish_on_every_rank(write_set, replay_and_simulate, model, plan,
                                                     overrides):
    finishes(replay_and_simulate(write_set(model, plan, **overrides)), plan.world_size)


@pytest.mark.parametrize("comm", ["p2p", "all-gather"])
def test_timed_context_parallel_sets_finish_with_background_reductions(host, tmp_path, replay_and_simulate,
                                                                      comm):
    """With --gpu, gradient reductions and ZeRO-3 gathers are placed into the compute
    windows between foreground sends and collectives, here among the ring's sends."""
    from stage_core import hardware
    from stage_core.flow import plan_job, write_trace_set

    plan = Plan(cp=4, tp=2, sp=True, dp=2, pp=2, zero=3, cp_comm=comm, micro_batches=4)
    result = plan_job(host, "llama-tiny", {"layers": "4"}, plan, hardware.resolve(host, "h100"))
    out = write_trace_set(host, result, tmp_path / "set")
    _, status, results = replay_and_simulate(out)
    assert results["summary"]["deadlocked_ranks"] == [] and results["summary"]["finished_ranks"] == 32
    assert status == 0


@pytest.fixture(scope="module")
def toy_host():
    from stage_core.plugins import PluginHost
    from stage_core.testing import toy_plugin

    host = PluginHost()
    host.register(toy_plugin, "toy")
    return host


@pytest.mark.parametrize("plan", [p for p in strategy_matrix() if p.world_size > 1], ids=plan_id)
def test_every_matrix_plan_finishes_on_every_rank(toy_host, tmp_path, replay_and_simulate, plan):
    result = plan_job(toy_host, "toy", matrix_overrides(plan), plan)
    out = write_trace_set(toy_host, result, tmp_path / "set")
    finishes(replay_and_simulate(out), plan.world_size)


TINY_MIXTRAL = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
                "expert_ffn_hidden": 128, "vocab_size": 512}
TINY_DEEPSEEK = {"layers": 4, "first_dense_layers": 1, "hidden": 64, "heads": 4, "kv_heads": 4,
                 "vocab_size": 512, "experts": 8, "experts_per_token": 2, "expert_ffn_hidden": 64,
                 "ffn_hidden": 128, "shared_expert_ffn_hidden": 64, "mtp_layers": 0,
                 "expert_groups": 2, "topk_groups": 1, "q_lora_rank": 32, "kv_lora_rank": 16,
                 "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}
MOE_PLANS = [
    ("moe-tiny", Plan(dp=4, ep=4, seq_len=64), {}),
    ("moe-tiny", Plan(dp=2, ep=2, tp=2, sp=True, seq_len=64), {}),
    ("moe-tiny", Plan(pp=2, dp=2, ep=2, micro_batches=4, schedule="1f1b", seq_len=64), {}),
    ("moe-tiny", Plan(dp=4, ep=2, tp=2, etp=1, sp=True, zero=1, moe_dispatcher="allgather",
                      seq_len=64), {}),
    ("mixtral-8x7b", Plan(dp=4, ep=4, tp=2, sp=True, pp=2, micro_batches=2, seq_len=64),
     TINY_MIXTRAL),
    ("moe-tiny", Plan(dp=2, tp=2, sp=True, seq_len=64), {}),
    ("moe-tiny", Plan(pp=2, dp=2, micro_batches=4, schedule="1f1b", seq_len=64), {}),
    ("moe-mla-tiny", Plan(dp=2, tp=2, zero=1, recompute="full", seq_len=64), {}),
    ("mixtral-8x7b", Plan(dp=2, tp=2, sp=True, zero=1, seq_len=64), TINY_MIXTRAL),
    ("mixtral-8x7b", Plan(pp=2, tp=2, micro_batches=4, schedule="gpipe", seq_len=64), TINY_MIXTRAL),
    ("deepseek-v3", Plan(pp=2, dp=2, micro_batches=2, seq_len=64), TINY_DEEPSEEK),
    ("deepseek-v3", Plan(tp=2, sp=True, dp=2, zero=3, seq_len=64), TINY_DEEPSEEK),
]


@pytest.mark.parametrize("model,plan,overrides", MOE_PLANS,
                         ids=lambda x: x if isinstance(x, str) else None)
def test_moe_plans_finish_on_every_rank(write_set, replay_and_simulate, model, plan, overrides):
    finishes(replay_and_simulate(write_set(model, plan, **overrides)), plan.world_size)
