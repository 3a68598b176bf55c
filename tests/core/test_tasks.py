"""Prefill and decode derived from the toy model's forward graph (stage_core.tasks).

Oracles: REFERENCE §1 (Megatron: a GPT layer's forward is 24·b·s·h² + 4·b·s²·h FLOPs
with the full s×s score matrix; the LM head 2·b·s·h·V), counted by hand for the
toy (h 64, 4 heads of 16, f = 4h, V 128, 2 layers, tied embeddings, bf16).
"""

from __future__ import annotations

import pytest

from stage_core.flow import plan_job
from stage_core.cli import main
from stage_core.ir.tensor import Role
from stage_core.models import evaluate_sum
from stage_core.parallel import Plan
from stage_core.tasks import CONTEXT, inference_graph
from stage_core.testing import ToyConfig, build_toy, fresh_host, jsonl_plugin, toy_plugin

H, L, V, HEADS, D = 64, 2, 128, 4, 16


def forward_flops(b: int, s: int) -> int:
    """REFERENCE §1's forward (a third of 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)))."""
    return 24 * b * s * L * H * H + 4 * b * s * s * L * H + 2 * b * s * H * V


def values(b, s, ctx):
    return {**build_toy(ToyConfig()).dims, "b": b, "s": s, CONTEXT: ctx}


def matmul(graph, b, s, ctx):
    return evaluate_sum([op.matmul_flops for op in graph.kernels()], values(b, s, ctx))


def test_prefill_is_the_forward_with_causal_attention_and_the_last_token_through_the_head():
    b, s = 3, 32
    g = inference_graph(build_toy(ToyConfig()), "prefill")
    causal = 2 * b * s * s * L * H  # half of the 4·b·s²·h of each layer's Q·Kᵀ and P·V
    last_token_only = 2 * b * (s - 1) * H * V
    assert matmul(g, b, s, s) == forward_flops(b, s) - causal - last_token_only


def test_decode_attends_to_the_whole_context_and_one_token_per_request():
    b, ctx = 5, 100
    g = inference_graph(build_toy(ToyConfig()), "decode")
    per_token = 24 * L * H * H + 4 * L * ctx * H + 2 * H * V
    assert matmul(g, b, 1, ctx) == b * per_token


def test_inference_has_no_backward_optimizer_dropout_or_labels():
    forward = build_toy(ToyConfig())
    for task in ("prefill", "decode"):
        g = inference_graph(forward, task)
        assert {op.phase for op in g.ops} == {"forward"}
        assert not any(op.fn in ("dropout", "dropout_add", "bias_dropout_add", "cross_entropy") for op in g.ops)
        assert [t.name for t in g.inputs] == ["tokens"]
        # residual adds keep their bias: x + bias + residual, 2 FLOPs per element, no mask
        adds = [op for op in g.ops if op.fn == "bias_add"]
        assert len(adds) == 2 * L and all(len(op.outputs) == 1 for op in adds)
        assert evaluate_sum([adds[0].other_flops], values(1, 7, 7)) == 2 * 7 * H


def test_keys_and_values_are_cached_per_layer():
    b, s, ctx = 2, 32, 50
    for task in ("prefill", "decode"):
        g = inference_graph(build_toy(ToyConfig()), task)
        assert [c.name for c in g.caches] == [f"layers.{i}.attn.{kv}_cache" for i in range(L) for kv in "kv"]
        assert all(c.tensor.role is Role.CACHE for c in g.caches)
        # bf16 K and V of every head, every layer, every cached token
        n = s if task == "prefill" else ctx
        assert evaluate_sum([c.tensor.nbytes for c in g.caches], values(b, s, n)) == 2 * L * HEADS * D * 2 * b * n
    # decode: the attention reads the cache (its bytes), prefill the step's own keys
    dec = inference_graph(build_toy(ToyConfig()), "decode")
    (scores,) = [op for op in dec.ops if op.name == "layers.0.attn.scores"]
    assert scores.inputs[1].role is Role.CACHE


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"))


def test_decode_steps_grow_the_context_a_token_a_step(host):
    b, ctx, n = 2, 20, 4
    one = plan_job(host, "toy", {}, Plan(task="decode", micro_batch_size=b, context_len=ctx))
    steps = plan_job(host, "toy", {}, Plan(task="decode", micro_batch_size=b, context_len=ctx, decode_steps=n))
    per_token = [24 * L * H * H + 4 * L * c * H + 2 * H * V for c in range(ctx, ctx + n)]
    assert one.reports[0].flops["matmul"] == b * per_token[0]
    assert steps.reports[0].flops["matmul"] == b * sum(per_token)
    assert steps.reports[0].flops["model"] == steps.reports[0].flops["matmul"]  # no backward: 1x, not 3x
    # the cache is held at the last step's context
    assert steps.reports[0].memory_bytes["kv_cache"] == 2 * L * HEADS * D * 2 * b * (ctx + n - 1)
    assert steps.manifest["inference"]["context_len"] == ctx + n - 1


def test_memory_is_the_weights_and_the_cache_of_every_micro_batch(host):
    b, m, ctx = 2, 3, 40
    r = plan_job(host, "toy", {}, Plan(task="decode", micro_batch_size=b, micro_batches=m, context_len=ctx))
    mem = r.reports[0].memory_bytes
    params = 2 * (V * H + L * (12 * H * H + 13 * H) + 2 * H)  # bf16; GPT with tied embeddings, no positions
    assert mem["parameters"] == params
    assert mem["gradients"] == mem["optimizer"] == 0
    assert mem["kv_cache"] == 2 * L * HEADS * D * 2 * b * m * ctx
    assert mem["total"] == params + mem["kv_cache"] + mem["activations"]


@pytest.mark.parametrize("argv,words", [
    (["--task", "infer"], "--task infer: valid values are train, prefill, decode, serve"),
    (["--decode-steps", "4"], "--decode-steps 4: chains decode steps; it needs --task decode"),
    (["--task", "prefill", "--context-len", "9"], "--context-len 9: the tokens a decode step attends to"),
    (["--task", "decode", "--seq-len", "8"], "--seq-len 8: decode computes one new token per request"),
    (["--task", "decode", "--decode-steps", "0"], "--decode-steps 0: must be a positive integer"),
    (["--task", "decode", "--dp", "2", "--zero", "1"], "--zero 1: ZeRO shards gradients and optimizer state"),
    (["--task", "prefill", "--recompute", "full"], "--recompute full: recompute saves activations"),
    (["--task", "decode", "--cp", "2"], "--cp 2: context parallel splits long prompts; it applies to --task prefill"),
])
def test_bad_task_input_is_one_line_and_exit_2(host, capsys, argv, words):
    assert main(["report", "--model", "toy", *argv], host=host) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_report_prints_the_cache_and_the_largest_batch_that_fits(host, capsys):
    b, ctx = 4, 32
    assert main(["report", "--model", "toy", "--task", "decode", "--micro-batch-size", str(b),
                 "--context-len", str(ctx), "--gpu-memory", "0.001", "--json"], host=host) == 0
    import json

    m = json.loads(capsys.readouterr().out)
    inf = m["inference"]
    per_request = 2 * L * HEADS * D * 2 * ctx
    assert inf["kv_cache_bytes_per_request"] == per_request
    assert inf["kv_cache_elements_per_token_per_layer"] == 2 * HEADS * D
    mem = m["rank_classes"][0]["memory_bytes"]
    per_request_on_rank = (mem["kv_cache"] + mem["activations"]) / b
    # --gpu-memory is in GiB (2^30 bytes), as every memory STAGE prints
    assert inf["gpu_memory_bytes"] == int(0.001 * 2**30) == 1_073_741
    assert inf["largest_batch"] == int((1_073_741 - mem["parameters"]) // per_request_on_rank)
    assert main(["report", "--model", "toy", "--task", "decode", "--gpu-memory", "0"], host=host) == 2


def windowed(window: int):
    """One layer of the core's GQA block with local attention (h 128, 4 heads of 32, 2 groups)."""
    from stage_core.ir import blocks
    from stage_core.ir.builder import GraphBuilder

    g = GraphBuilder("local", dims={"h": 128, "a": 4, "g": 2, "d": 32, "f": 256, "V": 256})
    x, labels, wte = blocks.embed(g)
    with g.layer(0):
        x = g.add(blocks.gqa_attention(g, blocks.norm(g, x, "attn.norm"), rope=True, window=window), x,
                  name="attn.residual")
    return blocks.lm_head(g, x, labels, wte)


@pytest.mark.parametrize("ctx", [10, 100])
def test_local_attention_decode_reads_and_keeps_only_its_window(ctx):
    w, a, kv, d = 16, 4, 2, 32
    g = inference_graph(windowed(w), "decode")
    (flash,) = [op for op in g.ops if op.fn == "flash_attention"]
    keys = min(w, ctx)
    at = {**g.dims, "b": 1, "s": 1, CONTEXT: ctx}
    assert evaluate_sum([flash.matmul_flops], at) == 2 * 2 * a * d * keys
    assert evaluate_sum([c.tensor.numel for c in g.caches], at) == 2 * kv * d * keys


def test_local_attention_prefill_counts_the_causal_band():
    w, a, d, s = 16, 4, 32, 64
    g = inference_graph(windowed(w), "prefill")
    (flash,) = [op for op in g.ops if op.fn == "flash_attention"]
    # each query reads the w keys before it, the first w fewer: s·w − w²/2 pairs
    at = {**g.dims, "b": 1, "s": s, CONTEXT: s}
    assert evaluate_sum([flash.matmul_flops], at) == 2 * 2 * a * d * (s * w - w * w // 2)


@pytest.mark.parametrize("argv,words", [
    (["--task", "serve", "--decode-ranks", "2"], "--task serve needs --prefill-ranks"),
    (["--prefill-ranks", "2"], "--prefill-ranks splits the ranks between prefill and decode; it needs --task serve"),
    (["--task", "serve", "--dp", "4", "--prefill-ranks", "1", "--decode-ranks", "2"],
     "--prefill-ranks 1 + --decode-ranks 2 = 3 does not add up to the world of 4 ranks"),
    (["--task", "serve", "--prefill-ranks", "3", "--decode-ranks", "2", "--prefill-plan", "tp=2"],
     "--prefill-ranks 3: the prefill plan (tp 2 x cp 1 x pp 1) needs a multiple of 2 ranks"),
    (["--task", "serve", "--prefill-ranks", "1", "--decode-ranks", "2", "--decode-plan", "cp=2"],
     "--decode-plan cp=2: context parallel splits long prompts; it applies to the prefill side only"),
    (["--task", "serve", "--prefill-ranks", "1", "--decode-ranks", "1", "--prefill-plan", "zp=2"],
     "--prefill-plan zp=2: expected KEY=VALUE pairs separated by commas, KEY one of tp, pp, dp"),
    (["--task", "serve", "--prefill-ranks", "1", "--decode-ranks", "2"],
     "the prefill step's 1 requests (dp 1 x 1) must split evenly over the 2 decode replicas"),
    (["--task", "serve", "--prefill-ranks", "1", "--decode-ranks", "1", "--prefill-plan", "micro-batch-size=4",
      "--decode-plan", "micro-batch-size=2"], "each decode replica would receive 4 new requests but holds 2"),
    (["--task", "serve", "--prefill-ranks", "1", "--decode-ranks", "1", "--context-len", "32"],
     "--context-len 32: the decode side starts after the prompt of --seq-len 32 and its first token"),
])
def test_bad_serve_input_is_one_line_and_exit_2(host, capsys, argv, words):
    assert main(["report", "--model", "toy", *argv], host=host) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_serve_writes_one_set_for_both_sides(host, tmp_path):
    """Prefill rank 0, decode rank 1: the two prompts' caches, one pair each."""
    out = tmp_path / "serve"
    assert main(["generate", "--model", "toy", "--task", "serve", "--prefill-ranks", "1", "--decode-ranks", "1",
                 "--micro-batch-size", "2", "--decode-plan", "micro-batch-size=4", "--format", "jsonl",
                 "-o", str(out)], host=host) == 0
    import json

    m = json.loads((out / "manifest.json").read_text())
    assert m["world_size"] == 2 and m["plan"]["task"] == "serve"
    assert [(rc["side"], rc["ranks"]) for rc in m["rank_classes"]] == [("prefill", [0]), ("decode", [1])]
    assert m["plan"]["decode"]["context_len"] == 32 + 1  # the toy's prompt of 32, then the first new token
    per_request = 2 * L * HEADS * D * 2 * 32
    assert m["kv_transfer"] == {"requests": 2, "messages": 2, "bytes": 2 * per_request,
                                "bytes_per_request": per_request, "max_sent_per_prefill_rank": 2 * per_request,
                                "max_received_per_decode_rank": 2 * per_request}
