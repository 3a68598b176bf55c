"""Inference on the real models (issue 13's "done when"), and in the real simulator.

Oracles: Llama 3 70B's public shape (REFERENCE §4: L 80, h 8192, a 64, g 8, d 128,
f 28672, V 128256); a decode token's FLOPs counted by hand; REFERENCE §1's generalised
Megatron count (a third of it is the forward) for prefill; REFERENCE §3 (one TP
all-reduce of b·s·h·2 bytes per attention and MLP block); DeepSeek-V3's MLA cache of
576 elements per token per layer (REFERENCE §4); the H100 datasheet's HBM bandwidth.
"""

from __future__ import annotations

import pytest

from stage_core.flow import plan_job
from stage_core.parallel import Plan
from stage_core.trace import CollectiveType, NodeType

L, H, A, G, D, F, V = 80, 8192, 64, 8, 128, 28672, 128256  # Llama 3 70B
HBM = 3350e9  # H100 SXM5, bytes per second (the simulator's h100 preset)


@pytest.fixture(scope="module")
def llama70b_decode(host):
    return plan_job(host, "llama3-70b", {}, Plan(task="decode", tp=8, micro_batch_size=64, context_len=8192))


def test_llama3_70b_decode_cache_is_2_l_g_over_t_d_2_batch_context_per_rank(llama70b_decode):
    batch, ctx, t = 64, 8192, 8
    (rc,) = llama70b_decode.reports
    assert rc.memory_bytes["kv_cache"] == 2 * L * (G // t) * D * 2 * batch * ctx == 21_474_836_480
    assert rc.memory_bytes["gradients"] == rc.memory_bytes["optimizer"] == 0


def test_llama3_70b_decode_flops_per_token_are_the_hand_count(llama70b_decode):
    batch, ctx, t = 64, 8192, 8
    per_layer = (2 * H * (A + 2 * G) * D  # q, k, v projections
                 + 2 * 2 * A * D * ctx  # Q·Kᵀ and P·V over the context
                 + 2 * A * D * H  # output projection
                 + 3 * 2 * H * F)  # gate, up, down
    hand = L * per_layer + 2 * H * V  # and the LM head
    (rc,) = llama70b_decode.reports
    per_token = rc.flops["total"] * t / batch
    assert abs(per_token - hand) <= 0.01 * hand
    assert rc.flops["matmul"] * t == batch * hand  # the matmuls exactly; norms, RoPE, softmax are the rest


def test_llama3_70b_decode_one_all_reduce_per_block_per_layer_of_batch_h_2(llama70b_decode):
    batch = 64
    (program,) = llama70b_decode.job.programs
    colls = [n for n in program.nodes if n.type == NodeType.COMM_COLL]
    blocks = [n for n in colls if n.name.endswith((".attn.proj", ".mlp.down"))]
    assert len(blocks) == 2 * L
    assert {(n.comm_type, n.comm_size) for n in blocks} == {(CollectiveType.ALL_REDUCE, batch * H * 2)}
    for i in range(L):
        assert sum(n.name.endswith((f"layers.{i}.attn.proj", f"layers.{i}.mlp.down")) for n in blocks) == 2
    # the rest: the vocabulary-parallel embedding's all-reduce, the logits gathered for the sampler
    rest = sorted((n.comm_type, n.comm_size) for n in colls if n not in blocks)
    assert rest == [(CollectiveType.ALL_REDUCE, batch * H * 2), (CollectiveType.ALL_GATHER, batch * V // 8 * 2)]


def test_llama3_70b_prefill_is_the_forward_count_with_causal_attention(host):
    b, s, t = 2, 8192, 8
    r = plan_job(host, "llama3-70b", {}, Plan(task="prefill", tp=8, micro_batch_size=b, seq_len=s))
    bracket_x3 = 4 * b * s * L * H * H  # a third of Megatron's 12·B·s·L·h² (the forward)
    forward = (bracket_x3 * (1 + G / A + s / H) * (A * D / H) + bracket_x3 * F * 3 / (2 * H)
               + bracket_x3 * V / (2 * L * H))
    causal = 2 * b * s * s * L * A * D  # half the score matrix of Q·Kᵀ and P·V
    head = 2 * b * (s - 1) * H * V  # only each prompt's last token goes through the head
    (rc,) = r.reports
    assert rc.flops["matmul"] * t == forward - causal - head
    assert rc.memory_bytes["kv_cache"] == 2 * L * (G // t) * D * 2 * b * s


def test_deepseek_v3_caches_576_elements_per_token_per_layer(host):
    r = plan_job(host, "deepseek-v3", {"layers": "4"}, Plan(task="decode", micro_batch_size=32, context_len=1024))
    assert r.manifest["inference"]["kv_cache_elements_per_token_per_layer"] == 576
    assert r.reports[0].memory_bytes["kv_cache"] == 4 * 576 * 2 * 32 * 1024


def test_context_parallel_prefill_caches_each_ranks_part_of_the_prompt(host):
    """Llama 3's all-gather CP (REFERENCE §3): each rank gathers the K and V blocks of the
    others, (s/cp)·b·g·d·2 bytes each per layer, and keeps its own part in the cache."""
    layers, g, d, h, b, s, cp = 4, 8, 128, 4096, 2, 4096, 2  # Llama 3 8B, 4 layers
    r = plan_job(host, "llama3-8b", {"layers": str(layers)},
                 Plan(task="prefill", cp=cp, cp_comm="all-gather", micro_batch_size=b, seq_len=s))
    (rc,) = r.reports
    assert rc.memory_bytes["kv_cache"] == 2 * layers * g * d * 2 * b * s // cp
    # K and V of every layer, and the row of each prompt's last token for the LM head
    assert rc.comm_bytes["all_gather"] == layers * 2 * (s // cp) * b * g * d * 2 + b * h * 2


@pytest.mark.parametrize("argv,words", [
    (["--task", "decode", "--context-len", "8193"], "--context-len 8193: llama3-70b has 8192 positions; give "
                                                    "--context-len at most 8192"),
    (["--task", "decode", "--context-len", "8000", "--decode-steps", "200"],
     "--context-len 8000 + --decode-steps 200 - 1 = 8199: llama3-70b has 8192 positions; give --context-len at "
     "most 7993"),
    (["--task", "serve", "--prefill-ranks", "8", "--decode-ranks", "8", "--tp", "8", "--seq-len", "8192"],
     "--seq-len 8192: decoding after the prompt reaches position 8193, beyond the 8192 positions of llama3-70b; "
     "give --seq-len at most 8191"),
])
def test_a_context_beyond_the_models_positions_is_one_line(run_stage, argv, words):
    done = run_stage("report", "--model", "llama3-70b", *argv)
    assert done.returncode == 2
    assert done.stderr.strip() == f"stage: error: {words}" or words in done.stderr and done.stderr.count("\n") == 1, \
        done.stderr


@pytest.mark.parametrize("task,tokens", [("decode", 16), ("prefill", 2 * 512)])
def test_expert_parallel_dispatch_is_sized_by_the_steps_tokens(host, task, tokens):
    """REFERENCE §3: per MoE layer an all-to-all dispatch and combine of T·k·h·2 bytes per GPU,
    T the tokens the rank has in the step: one per request in decode, the prompts' in prefill."""
    layers, h, k, experts, ep = 2, 4096, 2, 8, 4  # Mixtral 8x7B, 2 layers
    plan = (Plan(task="decode", ep=ep, dp=ep, micro_batch_size=16, context_len=2048) if task == "decode" else
            Plan(task="prefill", ep=ep, dp=ep, micro_batch_size=2, seq_len=512))
    r = plan_job(host, "mixtral-8x7b", {"layers": str(layers)}, plan)
    (rc,) = r.reports
    assert rc.comm_bytes["all_to_all"] == layers * 2 * tokens * k * h * 2
    dense = plan_job(host, "mixtral-8x7b", {"layers": str(layers)}, plan.replace(ep=1)).reports[0]
    experts_bytes = layers * experts * 3 * h * 14336 * 2  # gate, up, down of every expert, bf16
    assert dense.memory_bytes["parameters"] - rc.memory_bytes["parameters"] == experts_bytes - experts_bytes // ep


# --------------------------------------------------------------------------- the real simulator
DENSE = ("llama3-8b", {"layers": 4})
MOE = ("mixtral-8x7b", {"layers": 2})

SETS = [
    (*DENSE, Plan(task="prefill", tp=2, pp=2, micro_batches=2, micro_batch_size=2, seq_len=1024)),
    (*DENSE, Plan(task="decode", tp=2, pp=2, micro_batches=2, micro_batch_size=16, context_len=2048,
                  decode_steps=2)),
    (*DENSE, Plan(task="prefill", cp=2, cp_comm="p2p", micro_batch_size=2, seq_len=2048)),
    (*DENSE, Plan(task="prefill", cp=2, tp=2, cp_comm="all-gather", seq_len=2048)),
    (*MOE, Plan(task="prefill", tp=2, micro_batch_size=2, seq_len=1024)),
    (*MOE, Plan(task="decode", tp=2, dp=2, micro_batch_size=16, context_len=2048)),
    (*MOE, Plan(task="decode", ep=4, dp=4, micro_batch_size=16, context_len=2048, decode_steps=2)),
    (*MOE, Plan(task="prefill", ep=2, dp=2, tp=2, micro_batch_size=2, seq_len=1024)),
]


@pytest.mark.parametrize("model,overrides,plan", SETS, ids=lambda x: x if isinstance(x, str) else None)
def test_inference_sets_finish_on_every_rank(write_set, simulate, model, overrides, plan):
    status, results = simulate(write_set(model, plan, **overrides))
    assert results["summary"]["deadlocked_ranks"] == []
    assert results["summary"]["finished_ranks"] == plan.world_size
    assert status == 0


def test_decode_step_is_memory_bound(host, write_set, simulate):
    """Two replicas (the simulator needs two ranks), no communication: the step takes the
    bytes it touches over the HBM bandwidth."""
    plan = Plan(task="decode", dp=2, micro_batch_size=32, context_len=4096)
    model, overrides = DENSE
    out = write_set(model, plan, **overrides)
    status, results = simulate(out)
    assert status == 0
    from stage_core.flow import read_trace_set

    nodes = dict(read_trace_set(host, out).iter_ranks())[0]
    assert not any(n.type in (NodeType.COMM_COLL, NodeType.COMM_SEND) for n in nodes)
    comp = [n for n in nodes if n.type == NodeType.COMP]
    seconds_of_bytes = sum(n.attr("tensor_size") for n in comp) / HBM
    seconds_of_flops = sum(n.attr("num_ops") for n in comp) / 989.4e12
    step = results["summary"]["max_finish_time_ns"] / 1e9
    assert seconds_of_bytes > 10 * seconds_of_flops
    assert abs(step - seconds_of_bytes) <= 0.01 * seconds_of_bytes


# --------------------------------------------------------------------------- serve
SERVE_SETS = [
    # dense: prefill tp2 pp2 (2 micro-batches of 2 prompts), decode tp2 dp2 over 2 steps
    (*DENSE, Plan(task="prefill", tp=2, pp=2, micro_batch_size=2, micro_batches=2, seq_len=1024),
     Plan(task="decode", tp=2, dp=2, micro_batch_size=8, context_len=1025, decode_steps=2)),
    # MoE: prefill tp2, decode tp4
    (*MOE, Plan(task="prefill", tp=2, micro_batch_size=4, seq_len=512),
     Plan(task="decode", tp=4, micro_batch_size=16, context_len=513)),
    # MoE: prefill tp2 ep2 (dp2), decode ep4 (dp4)
    (*MOE, Plan(task="prefill", tp=2, ep=2, dp=2, micro_batch_size=2, seq_len=512),
     Plan(task="decode", ep=4, dp=4, micro_batch_size=8, context_len=513)),
]


@pytest.mark.parametrize("model,overrides,prefill,decode", SERVE_SETS, ids=["dense", "moe", "moe-ep"])
def test_serve_sets_finish_on_every_rank(host, tmp_path, simulate, model, overrides, prefill, decode):
    from stage_core.flow import write_trace_set
    from stage_core.serve import plan_serve

    result = plan_serve(host, model, {k: str(v) for k, v in overrides.items()}, prefill, decode)
    status, results = simulate(write_trace_set(host, result, tmp_path / "serve"))
    world = prefill.world_size + decode.world_size
    assert results["summary"]["deadlocked_ranks"] == []
    assert results["summary"]["finished_ranks"] == world
    assert status == 0


def test_mla_latent_is_taken_from_each_prefill_copy_in_turn(host):
    """MLA keeps one latent per token (not per head): every tp rank holds all of it, so
    each decode rank receives the whole cache, the decode ranks taking turns among the
    prefill ranks' copies."""
    from stage_core.serve import plan_serve

    s, layers = 64, 2
    r = plan_serve(host, "moe-mla-tiny", {"layers": str(layers)},
                   Plan(task="prefill", tp=2, micro_batch_size=1, seq_len=s),
                   Plan(task="decode", tp=2, micro_batch_size=1, context_len=s + 1))
    per_token = r.decode.manifest["inference"]["kv_cache_elements_per_token"]
    assert sorted(r.transfers) == [(0, 0, 0, per_token * s * 2), (1, 1, 0, per_token * s * 2)]


def test_serve_takes_expert_parallel_from_the_main_flags(run_stage, tmp_path):
    """--ep applies to each side (carved out of that side's own dp), and --ranks writes a subset."""
    done = run_stage("generate", "--model", "mixtral-8x7b", "--set", "layers=2", "--task", "serve", "--ep", "2",
                     "--prefill-ranks", "2", "--decode-ranks", "2", "--micro-batch-size", "2", "--seq-len", "256",
                     "--decode-plan", "micro-batch-size=4", "--ranks", "0,3", "-o", tmp_path / "s")
    assert done.returncode == 0, done.stderr
    import json

    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert (m["plan"]["prefill"]["ep"], m["plan"]["prefill"]["dp"]) == (2, 2)
    assert (m["plan"]["decode"]["ep"], m["plan"]["decode"]["dp"]) == (2, 2)
    assert sorted(p.name for p in (tmp_path / "s").glob("trace.*.et")) == ["trace.0.et", "trace.3.et"]
