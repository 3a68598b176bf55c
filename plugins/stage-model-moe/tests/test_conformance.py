"""The plugin against STAGE's conformance kit (stage_core.testing), with published numbers."""

from stage_core.testing import (assert_config_round_trips, assert_flops_conserved, assert_param_count, assert_tasks,
                                fresh_host, jsonl_plugin, reference_strategies)

import stage_model_moe.plugin as moe

HOST = fresh_host((moe, "moe"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"))


def test_mixtral_parameters_by_hand():
    # per layer: attention 2·h² + 2·h·g·d, 8 experts x 3·h·f, router h·E, two norms; embedding and head 2·V·h,
    # final norm: 46.70B total, 12.88B active (Mixtral of experts, arXiv 2401.04088: 46.7B and 12.9B)
    h, f, V, L, E = 4096, 14336, 32000, 32, 8
    total = L * (2 * h * h + 2 * h * 8 * 128 + E * 3 * h * f + h * E + 2 * h) + 2 * V * h + h
    assert_param_count(HOST, "mixtral-8x7b", total, active=total - L * (E - 2) * 3 * h * f)


def test_configs_tasks_and_flops_conserved():
    for family in {s.family for s in HOST.models()}:
        assert_config_round_trips(HOST, family)
    for model in ("moe-tiny", "moe-mla-tiny"):
        assert assert_tasks(HOST, model) == {"train": "ok", "prefill": "ok", "decode": "ok"}
        assert assert_flops_conserved(HOST, model) >= 4
