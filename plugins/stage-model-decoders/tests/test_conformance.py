"""The plugin against STAGE's conformance kit (stage_core.testing), with published numbers."""

from stage_core.testing import (assert_config_round_trips, assert_flops_conserved, assert_param_count, assert_tasks,
                                fresh_host, jsonl_plugin, reference_strategies)

import stage_model_decoders.plugin as decoders

HOST = fresh_host((decoders, "decoders"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"))


def test_gemma2_9b_parameters_are_the_checkpoints():
    # Hugging Face Hub safetensors.total of google/gemma-2-9b
    assert_param_count(HOST, "gemma2-9b", 9_241_705_984)


def test_configs_tasks_and_flops_conserved():
    for family in {s.family for s in HOST.models()}:
        assert_config_round_trips(HOST, family)
    assert assert_tasks(HOST, "gemma-tiny") == {"train": "ok", "prefill": "ok", "decode": "ok"}
    assert assert_flops_conserved(HOST, "gemma-tiny") >= 8
