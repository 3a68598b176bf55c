"""The standard strategies against STAGE's conformance kit (stage_core.testing)."""

import pytest
from stage_core.api import Plan
from stage_core.testing import assert_strategy_conserves, fresh_host, jsonl_plugin, toy_plugin

import stage_parallel.plugin as parallel

HOST = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (parallel, "parallel"))


@pytest.mark.parametrize("strategy,plans", [
    ("cp", [Plan(cp=2, cp_comm=c) for c in ("p2p", "all-gather", "a2a")] + [Plan(cp=2, tp=2, sp=True)]),
    ("zero", [Plan(dp=2, zero=z, micro_batches=2) for z in (1, 2, 3)] + [Plan(dp=2, cp=2, zero=3)]),
    ("pp", [Plan(pp=2, dp=2, micro_batches=4, stage_layers=(1, 1)), Plan(pp=2, micro_batches=2, tp=2, sp=True)]),
])
def test_strategies_conserve_flops_and_memory(strategy, plans):
    # ring attention (cp p2p) needs the fused kernel: the toy model's flash attention
    assert assert_strategy_conserves(HOST, strategy, plans=plans, overrides={"attention": "flash"}) == len(plans)


def test_every_strategy_registers_with_a_description():
    assert {s.name for s in HOST.strategies()} >= {"dp", "tp", "sp", "cp", "ep", "pp", "zero", "recompute"}
    assert all(s.description for s in HOST.strategies())
