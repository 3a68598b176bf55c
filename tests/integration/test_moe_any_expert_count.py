"""MoE with any expert count, from the published config.json (issue 15, point 1).

Qwen1.5-MoE-A2.7B routes each token to 4 of 60 experts and adds a gated shared expert;
at 4096 tokens a uniform router gives 4096·4/60 = 273.07 tokens per expert, which used
to stop the plan ("b*k*s/E = 16384/60 is not a whole number").  A real router sends
whole tokens: the experts get floor or ceiling shares and the total stays tokens·k.
Checked through the routed experts' matmul FLOPs (a SwiGLU expert costs 3 matmuls of
2·h·fe per routed row forward, twice that backward) and in the real simulator.
"""

import json

import pytest

from stage_core.flow import plan_job
from stage_core.parallel import Plan

#: Qwen/Qwen1.5-MoE-A2.7B config.json (the keys as published; the model card: "14.3B
#: parameters in total and 2.7B activated")
QWEN15_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 16, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632, "sliding_window": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN = {"h": 2048, "fe": 1408, "E": 60, "k": 4}
MIXTRAL = {"h": 4096, "fe": 14336, "E": 8, "k": 2}


@pytest.fixture
def qwen_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN15_MOE))
    return path


def routed_rows(result, m) -> int:
    """Rows the routed experts process per step, summed over every rank, from their matmul FLOPs."""
    flops = sum(n.num_ops * len(prog.ranks) for prog in result.job.programs for n in prog.nodes
                if n.comm_type is None and ".moe.experts." in n.name and n.flops_kind == "matmul")
    per_row = 3 * 3 * 2 * m["h"] * m["fe"]  # gate, up, down; forward and backward
    assert flops % per_row == 0
    return flops // per_row


@pytest.mark.parametrize("seq", [4096, 1001])
def test_qwen15_moe_routes_tokens_times_k(host, qwen_json, seq):
    # 4096·4/60 and 1001·4/60 are not whole; the rows add up to tokens·k per MoE layer
    result = plan_job(host, str(qwen_json), {"layers": "2"}, Plan(seq_len=seq, micro_batches=2))
    assert routed_rows(result, QWEN) == 2 * 2 * seq * QWEN["k"]  # 2 micro-batches, 2 MoE layers


def test_mixtral_routes_tokens_times_k(host):
    result = plan_job(host, "mixtral-8x7b", {"layers": "2"}, Plan(seq_len=1001, dp=2))
    assert routed_rows(result, MIXTRAL) == 2 * 2 * 1001 * MIXTRAL["k"]  # dp 2, 2 MoE layers


@pytest.mark.parametrize("model,plan,overrides", [
    # the whole of Qwen1.5-MoE-A2.7B at 4096 tokens, dp2 pp2 (and tp2 with it)
    ("qwen", Plan(dp=2, pp=2, micro_batches=4, seq_len=4096), {}),
    ("qwen", Plan(tp=2, pp=2, micro_batches=2, seq_len=1001), {}),
    ("mixtral-8x7b", Plan(dp=2, pp=2, micro_batches=4, seq_len=1001), {"layers": 4}),
], ids=["qwen15-dp2-pp2-s4096", "qwen15-tp2-pp2-s1001", "mixtral-dp2-pp2-s1001"])
def test_sets_at_odd_lengths_finish(write_set, simulate, qwen_json, model, plan, overrides):
    out = write_set(str(qwen_json) if model == "qwen" else model, plan, **overrides)
    status, results = simulate(out)
    summary = results["summary"]
    assert summary["deadlocked_ranks"] == [] and summary["finished_ranks"] == plan.world_size and status == 0
