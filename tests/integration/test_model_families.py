"""Model families II in the real simulator: local/global attention and soft-capping (Gemma 2),
q/k norms over all heads (OLMo 2), sliding windows in every layer (Phi-3), Mamba-2 and
hybrid Mamba-2/attention/MLP/MoE stacks (Nemotron-H).

Every set must finish on every rank; the manifest's FLOPs are checked against the plugin's
own numbers where a plan splits them evenly.
"""

import json

import pytest

from stage_core.parallel import Plan


def test_models_lists_the_new_families_and_plugins_their_distribution(run_stage):
    models = run_stage("models", "--json")
    assert models.returncode == 0, models.stderr
    families = {}
    for row in json.loads(models.stdout):
        families.setdefault(row["family"], set()).add(row["plugin"])
    for family in ("gemma2", "gemma3", "phi3", "olmo2"):
        assert families[family] == {"decoders"}
    for family in ("mamba2", "nemotron_h"):
        assert families[family] == {"ssm"}
    plugins = {p["name"]: p for p in json.loads(run_stage("plugins", "--json").stdout)}
    assert plugins["decoders"]["source"] == "entrypoint" and not plugins["decoders"]["error"]
    assert "gemma2-9b" in plugins["decoders"]["provides"]["models"]
    assert plugins["ssm"]["source"] == "entrypoint" and "nemotron-h-8b" in plugins["ssm"]["provides"]["models"]

PLANS = [
    # Gemma 2 2B as published (26 layers, local/global alternating, soft-caps), tp2 pp2
    ("gemma2-2b", Plan(tp=2, pp=2, micro_batches=4, seq_len=1024), {}),
    ("gemma2-2b", Plan(tp=2, sp=True, pp=2, dp=2, micro_batches=4, seq_len=1024, schedule="interleaved",
                       virtual_stages=13), {}),
    ("gemma3-1b", Plan(pp=2, dp=2, micro_batches=2, seq_len=2048), {}),
    ("olmo2-7b", Plan(tp=4, pp=2, micro_batches=2, seq_len=1024), {"layers": 4}),
    ("phi3-mini", Plan(tp=2, sp=True, micro_batches=2, seq_len=4096), {"layers": 2}),
    # Nemotron-H 8B as published (52 layers: Mamba-2, attention, MLP), tp2 pp2, and with sp
    ("nemotron-h-8b", Plan(tp=2, pp=2, micro_batches=4, seq_len=1024), {}),
    ("nemotron-h-8b", Plan(tp=4, sp=True, pp=4, dp=2, micro_batches=4, seq_len=1024), {}),
    ("mamba2-2.7b", Plan(pp=4, dp=2, micro_batches=4, seq_len=2048, schedule="interleaved", virtual_stages=2), {}),
    # a hybrid with MoE layers: tp with sp, and at a sequence length whose routed tokens
    # (b·s·k/E = 250 per expert) no data-parallel degree divides
    ("hybrid-tiny", Plan(tp=2, sp=True, dp=2, micro_batches=2, seq_len=252), {}),
    ("hybrid-tiny", Plan(dp=4, pp=2, micro_batches=2, seq_len=250), {}),
]


@pytest.mark.parametrize("model,plan,overrides", PLANS, ids=lambda x: x if isinstance(x, str) else None)
def test_new_families_finish_on_every_rank(write_set, simulate, model, plan, overrides):
    out = write_set(model, plan, **overrides)
    status, results = simulate(out)
    summary = results["summary"]
    assert summary["deadlocked_ranks"] == [], summary
    assert summary["finished_ranks"] == plan.world_size
    assert status == 0


def test_gemma2_tp_pp_flops_add_up_to_the_model(host):
    # tp and pp split every matmul without repeating one: summed over the ranks, a step's
    # matmul FLOPs are micro_batches times one sequence's (the model plugin's count, which
    # test_decoders_flops checks by hand, local layers counting their 4096-token window)
    from stage_core.flow import plan_job
    from stage_core.models import training_flops
    from stage_model_decoders import PRESETS, build

    plan = Plan(tp=2, pp=2, micro_batches=4, seq_len=8192)
    manifest = plan_job(host, "gemma2-2b", {}, plan).manifest
    summed = sum(rc["flops"]["matmul"] * len(rc["ranks"]) for rc in manifest["rank_classes"])
    assert summed == 4 * training_flops(build(PRESETS["gemma2-2b"]), b=1, s=8192)


def test_tensor_parallel_must_divide_the_ssm_groups(run_stage):
    done = run_stage("report", "--model", "mamba2-2.7b", "--tp", "2")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "mg = 1" in done.stderr and "valid --tp: 1" in done.stderr


@pytest.mark.parametrize("model,plan", [
    ("mamba2-2.7b", Plan(task="decode", micro_batch_size=8, context_len=4096, pp=2, micro_batches=2)),
    ("nemotron-h-8b", Plan(task="decode", micro_batch_size=4, context_len=4096, tp=2, decode_steps=2)),
    ("nemotron-h-8b", Plan(task="prefill", seq_len=2048, tp=2, pp=2, micro_batches=2)),
], ids=["mamba2-decode-pp2", "nemotron-h-decode-tp2", "nemotron-h-prefill-tp2-pp2"])
def test_ssm_inference_sets_finish(write_set, simulate, model, plan):
    out = write_set(model, plan)
    status, results = simulate(out)
    summary = results["summary"]
    assert summary["deadlocked_ranks"] == [] and summary["finished_ranks"] == plan.world_size and status == 0


def test_hybrid_serving_sends_each_request_its_state_and_its_attention_cache(host, tmp_path, simulate):
    # Nemotron-H 8B, prefill tp2 and decode tp2: each request's cache is its 24 Mamba layers'
    # fixed states (51,806,208 bytes) and its 4 attention layers' keys and values of the
    # 1024-token prompt (4·2·8·128·2·1024 = 16,777,216 bytes), half from each tp rank
    from stage_core.flow import write_trace_set
    from stage_core.serve import plan_serve

    result = plan_serve(host, "nemotron-h-8b", {}, Plan(task="prefill", tp=2, seq_len=1024),
                        Plan(task="decode", tp=2, context_len=1025))
    assert sorted(n for _, _, _, n in result.transfers) == [34_291_712, 34_291_712]
    assert 2 * 34_291_712 == 51_806_208 + 16_777_216
    status, results = simulate(write_trace_set(host, result, tmp_path / "serve"))
    assert results["summary"]["finished_ranks"] == 4 and status == 0
