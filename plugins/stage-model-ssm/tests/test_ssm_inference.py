"""A Mamba layer's inference cache is its fixed recurrent state, not a KV cache.

Per request and Mamba layer the state is the SSM state H·P·N and the conv state, the last
k − 1 inputs of its H·P + 2·G·N channels, 16-bit: 2·(H·P·N + (k−1)·(H·P + 2·G·N)) bytes,
whatever the context.  For Nemotron-H 8B's 24 Mamba layers: 24·2·(128·64·128 + 3·10240) =
51,806,208 bytes, what a public derivation from its config.json finds too ("49.41 MiB per
request"); its 4 attention layers add 2·8·128·2 bytes per token each (128 MiB at 8192).
A decode step's scan is a state update, not a chunked scan: no matmul, 5 FLOPs per state
element, the state read and written.
"""

from __future__ import annotations

import pytest
from stage_core.api import Plan, evaluate_sum, inference_graph, plan_job
from stage_core.testing import fresh_host

from stage_model_ssm import PRESETS, build, plugin


def state_bytes(c) -> int:
    H, P, N, G, k = c.ssm_heads, c.ssm_head_dim, c.ssm_state, c.ssm_groups, c.conv_kernel
    return 2 * (H * P * N + (k - 1) * (H * P + 2 * G * N)) * len(c.layer_indices("mamba"))


def cache_of(model: str, task: str, **plan) -> dict:
    host = fresh_host((plugin, "ssm"))
    return plan_job(host, model, {}, Plan(task=task, **plan), programs=False).manifest


@pytest.mark.parametrize("context", [1024, 8192])
def test_mamba2_state_is_the_cache_whatever_the_context(context):
    m = cache_of("mamba2-2.7b", "decode", micro_batch_size=4, context_len=context)
    inference = m["inference"]
    assert inference["kv_cache_bytes_per_request"] == inference["recurrent_state_bytes_per_request"] \
        == state_bytes(PRESETS["mamba2-2.7b"]) == 85_950_464
    assert inference["kv_cache_elements_per_token"] == 0  # nothing grows with the context
    (rc,) = m["rank_classes"]
    assert rc["memory_bytes"]["kv_cache"] == 4 * 85_950_464


@pytest.mark.parametrize("task,plan", [("prefill", {"seq_len": 4096}), ("decode", {"context_len": 8192})])
def test_nemotron_h_state_and_attention_cache(task, plan):
    c = PRESETS["nemotron-h-8b"]
    inference = cache_of("nemotron-h-8b", task, **plan)["inference"]
    assert inference["recurrent_state_bytes_per_request"] == state_bytes(c) == 51_806_208
    tokens = plan.get("seq_len") or plan["context_len"]
    kv = 4 * 2 * 8 * 128 * 2 * tokens  # 4 attention layers, K and V of 8 heads of 128
    assert inference["kv_cache_bytes_per_request"] == 51_806_208 + kv
    assert inference["kv_cache_elements_per_token_per_layer"] == 2 * 8 * 128


def test_decode_scan_is_a_state_update():
    c = PRESETS["mamba2-2.7b"]
    g = inference_graph(build(c), "decode")
    (ssd,) = [op for op in g.ops if op.layer == 0 and op.fn == "ssd_state_update"]
    (conv,) = [op for op in g.ops if op.layer == 0 and op.fn == "causal_conv1d_update"]

    values = {**g.dims, "b": 1, "s": 1, "ctx": 4096}
    H, P, N = 80, 64, 128
    assert evaluate_sum([ssd.matmul_flops], values) == 0
    assert evaluate_sum([ssd.other_flops], values) == 5 * H * P * N + 6 * H + 4 * H * P
    # x read and y written, dt, B and C read, the state read and written
    assert evaluate_sum([ssd.bytes], values) == 2 * (2 * H * P + H + 2 * N + 2 * H * P * N)
    # the conv reads its three previous inputs per channel from the conv state and shifts it
    channels = H * P + 2 * N
    # (its input row, weights and bias, its output row, as in training, and 2 · 3 state rows)
    assert evaluate_sum([conv.bytes], values) == 2 * channels + (2 * 4 + 2) * channels + 2 * channels \
        + 2 * 2 * 3 * channels


def test_decode_flops_per_token_are_the_projections_and_the_head():
    # the one-token scan has no matmul: per token 64 layers of in_proj and out_proj
    # (80,363,520, Megatron's count) and the tied head 2·2560·50288
    (rc,) = cache_of("mamba2-2.7b", "decode", micro_batch_size=8, context_len=4096)["rank_classes"]
    assert rc["flops"]["matmul"] == 8 * (64 * 80_363_520 + 2 * 2560 * 50288) == 8 * 5_400_739_840


def test_prefill_runs_the_chunked_scan():
    g = inference_graph(build(PRESETS["mamba2-2.7b"]), "prefill")
    assert any(op.fn == "ssd_scan" for op in g.ops) and not any(op.fn == "ssd_state_update" for op in g.ops)
    writes = [op for op in g.ops if op.fn == "cache_write" and op.layer == 0]
    assert sorted(op.name.rsplit(".", 1)[-1] for op in writes) == ["conv_state", "ssm_state"]
