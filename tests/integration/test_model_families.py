"""Model families II in the real simulator: local/global attention and soft-capping (Gemma 2),
q/k norms over all heads (OLMo 2), sliding windows in every layer (Phi-3).

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
    plugins = {p["name"]: p for p in json.loads(run_stage("plugins", "--json").stdout)}
    assert plugins["decoders"]["source"] == "entrypoint" and not plugins["decoders"]["error"]
    assert "gemma2-9b" in plugins["decoders"]["provides"]["models"]

PLANS = [
    # Gemma 2 2B as published (26 layers, local/global alternating, soft-caps), tp2 pp2
    ("gemma2-2b", Plan(tp=2, pp=2, micro_batches=4, seq_len=1024), {}),
    ("gemma2-2b", Plan(tp=2, sp=True, pp=2, dp=2, micro_batches=4, seq_len=1024, schedule="interleaved",
                       virtual_stages=13), {}),
    ("gemma3-1b", Plan(pp=2, dp=2, micro_batches=2, seq_len=2048), {}),
    ("olmo2-7b", Plan(tp=4, pp=2, micro_batches=2, seq_len=1024), {"layers": 4}),
    ("phi3-mini", Plan(tp=2, sp=True, micro_batches=2, seq_len=4096), {"layers": 2}),
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
    from stage_core.api import plan_job
    from stage_core.models import training_flops
    from stage_model_decoders import PRESETS, build

    plan = Plan(tp=2, pp=2, micro_batches=4, seq_len=8192)
    manifest = plan_job(host, "gemma2-2b", {}, plan).manifest
    summed = sum(rc["flops"]["matmul"] * len(rc["ranks"]) for rc in manifest["rank_classes"])
    assert summed == 4 * training_flops(build(PRESETS["gemma2-2b"]), b=1, s=8192)
