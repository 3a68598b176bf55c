"""The plugin against STAGE's conformance kit (stage_core.testing), with published numbers."""

from stage_core.testing import (assert_config_round_trips, assert_flops_conserved, assert_forward_flops,
                                assert_param_count, assert_tasks, fresh_host, jsonl_plugin, reference_strategies)

import stage_model_gpt.plugin as gpt

HOST = fresh_host((gpt, "gpt"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"))


def test_gpt2_parameters_are_hugging_faces():
    # transformers' GPT2LMHeadModel.num_parameters() of openai-community/gpt2 (vocabulary 50257, unpadded)
    assert_param_count(HOST, "gpt2", 124_439_808, overrides={"vocab_pad_to": "1"})


def test_gpt3_forward_flops_are_narayanans():
    # Narayanan et al. 2021: forward 24·s·L·h² + 4·s²·L·h + 2·s·V·h per sequence (a third of Eq. 3)
    s, L, h, V = 2048, 96, 12288, 51200
    assert_forward_flops(HOST, "gpt3-175b", 24 * s * L * h * h + 4 * s * s * L * h + 2 * s * V * h)


def test_configs_tasks_and_flops_conserved():
    assert_config_round_trips(HOST, "gpt")
    assert assert_tasks(HOST, "gpt-tiny") == {"train": "ok", "prefill": "ok", "decode": "ok"}
    assert assert_flops_conserved(HOST, "gpt-tiny") >= 8
