"""The plugin against STAGE's conformance kit (stage_core.testing), with published numbers."""

from stage_core.testing import (assert_config_round_trips, assert_flops_conserved, assert_forward_flops,
                                assert_param_count, assert_tasks, fresh_host, jsonl_plugin, reference_strategies)

import stage_model_llama.plugin as llama

HOST = fresh_host((llama, "llama"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"))


def test_llama3_8b_parameters_are_the_checkpoints():
    # Hugging Face Hub safetensors.total of meta-llama/Meta-Llama-3-8B
    assert_param_count(HOST, "llama3-8b", 8_030_261_248)


def test_llama3_8b_forward_flops_are_megatrons():
    # Megatron-LM's num_floating_point_operations (REFERENCE §1), forward third, one sequence:
    # 4·s·L·h²·[(1 + g/a + s/h)·(a·d/h) + (f/h)·(3/2)] + 2·s·V·h with GQA and SwiGLU
    s, L, h, a, g, d, f, V = 8192, 32, 4096, 32, 8, 128, 14336, 128256
    per_layer = 2 * s * h * (a * d + 2 * g * d) + 4 * s * s * a * d + 2 * s * a * d * h + 3 * 2 * s * h * f
    assert_forward_flops(HOST, "llama3-8b", L * per_layer + 2 * s * V * h, seq_len=s)


def test_configs_tasks_and_flops_conserved():
    assert_config_round_trips(HOST, "llama")
    assert assert_tasks(HOST, "llama-tiny") == {"train": "ok", "prefill": "ok", "decode": "ok"}
    assert assert_flops_conserved(HOST, "llama-tiny") >= 8
