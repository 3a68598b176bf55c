"""Published config.json files of 2024-25 models, read by their keys (issue 21), as a user
gives them: training with tp and pp and decoding with the KV (or SSM state) cache, each
set finishing on every rank in the real simulator.  Layer counts are cut with the
config.json's own key (``--set num_hidden_layers=N``) to keep the sets small."""

import re
from pathlib import Path

import pytest

from stage_core.models import hf_import_of, param_counts
from stage_core.parallel import Plan

ROOT = Path(__file__).resolve().parents[2]
MOE = ROOT / "plugins/stage-model-moe/tests/configs"
SSM = ROOT / "plugins/stage-model-ssm/tests/configs"

#: Zamba2-1.2B's first 12 layers, with 2 SSM groups so that tp 2 divides them
ZAMBA2_CUT = {"num_hidden_layers": 12, "ssm_groups": 2}

TRAIN = Plan(tp=2, pp=2, micro_batches=2, seq_len=256)
DECODE = Plan(task="decode", tp=2, pp=2, micro_batches=2, micro_batch_size=4, context_len=512)

SETS = [
    # gpt-oss-20b: sliding and full attention alternating, sinks, experts with biases
    (MOE / "gpt-oss-20b.json", {"num_hidden_layers": 4}, TRAIN),
    (MOE / "gpt-oss-20b.json", {"num_hidden_layers": 4}, DECODE),
    (MOE / "gpt-oss-20b.json", {"num_hidden_layers": 2}, Plan(task="decode", ep=2, dp=2, micro_batch_size=8,
                                                              context_len=512)),
    # Llama 4 Maverick: MoE every other layer with a shared expert, chunked attention but
    # on every fourth layer
    (MOE / "Llama-4-Maverick-17B-128E.json", {"num_hidden_layers": 4}, TRAIN),
    (MOE / "Llama-4-Maverick-17B-128E.json", {"num_hidden_layers": 4}, DECODE),
    # DeepSeek-V2-Lite: MLA (absorbed for decode), a dense first layer, two shared experts
    (MOE / "DeepSeek-V2-Lite.json", {"num_hidden_layers": 4}, TRAIN),
    (MOE / "DeepSeek-V2-Lite.json", {"num_hidden_layers": 4}, DECODE),
    # Jamba: Mamba-1 (the selective scan, a registered kernel) and attention (layer 4 of 8),
    # MoE every other layer; decode keeps the SSM and conv states and the attention's KV cache
    (SSM / "Jamba-v0.1.json", {"num_hidden_layers": 8}, TRAIN),
    (SSM / "Jamba-v0.1.json", {"num_hidden_layers": 8}, DECODE),
    (SSM / "falcon-mamba-7b.json", {"num_hidden_layers": 4}, DECODE),
    # Zamba2-1.2B: Mamba-2 and a shared transformer block at layers 5 and 11 (one block, used
    # on both stages); decode keeps every mixer's state and each use's KV cache.  Two SSM
    # groups instead of one, so that tp 2 can split the mixers (Megatron's ngroups % tp)
    (SSM / "Zamba2-1.2B.json", ZAMBA2_CUT, DECODE),
]


@pytest.mark.parametrize("path,overrides,plan", SETS,
                         ids=[f"{p.stem}-{plan.task}-tp{plan.tp}pp{plan.pp}ep{plan.ep}" for p, _, plan in SETS])
def test_published_configs_finish_in_the_simulator(write_set, simulate, path, overrides, plan):
    out = write_set(str(path), plan, **overrides)
    status, results = simulate(out)
    summary = results["summary"]
    assert summary["deadlocked_ranks"] == [] and summary["finished_ranks"] == plan.world_size, summary
    assert status == 0


def test_set_num_hidden_layers_cuts_the_per_layer_lists(host):
    # gpt-oss's layer_types lists 24 layers: 4 layers keep its first four entries
    from stage_core.flow import resolve_model

    spec, config = resolve_model(host, str(MOE / "gpt-oss-20b.json"), {"num_hidden_layers": "4"})
    assert config.layers == 4 and [config.is_local(i) for i in range(4)] == [True, False, True, False]
    assert hf_import_of(config)["source"] == str(MOE / "gpt-oss-20b.json")
    full = param_counts(spec.build(resolve_model(host, str(MOE / "gpt-oss-20b.json"))[1]))[0]
    four = param_counts(spec.build(config))[0]
    # what 20 layers of the model hold: (full - four) / 20 per layer, the same for all
    assert (full - four) % 20 == 0


def test_zamba2_shared_block_on_two_stages_finishes_in_the_simulator(host, tmp_path, simulate):
    # layers 0-5 on stage 0 (the block's use at 5), 6-11 on stage 1 (its use at 11): each
    # stage holds the block and their gradients are summed over both, as a tied embedding's;
    # the embeddings the block reads go from the first stage to the second, and their
    # gradient back
    from stage_core.flow import plan_job, write_trace_set

    result = plan_job(host, str(SSM / "Zamba2-1.2B.json"), {k: str(v) for k, v in ZAMBA2_CUT.items()}, TRAIN)
    first = {re.sub(r"^mb\d+\.", "", n.name) for n in result.job.programs[0].nodes}  # of every micro-batch
    assert "grad_sync.shared:all_reduce.pp@0,1" in first
    assert {"chunk0.fwd:send:embed", "chunk0.bwd:recv:embed.grad"} <= first
    out = tmp_path / "zamba2"
    write_trace_set(host, result, out)
    status, results = simulate(out)
    summary = results["summary"]
    assert summary["deadlocked_ranks"] == [] and summary["finished_ranks"] == TRAIN.world_size, summary
    assert status == 0
