"""--stage-layers auto on the published models: Llama 3 405B at pp16 as the Llama 3 paper
split it, DeepSeek-V3's 61 layers (3 dense, 58 MoE) weighed by their compute."""

from stage_core.flow import resolve_model
from stage_core.autodiff import differentiate
from stage_core.parallel import Plan
from stage_parallel.stages import balanced_split, layer_weights


def weights(host, model, seq_len):
    spec, config = resolve_model(host, model)
    return layer_weights(differentiate(spec.build(config)), Plan(seq_len=seq_len))


def test_llama3_405b_pp16_drops_one_layer_from_the_first_and_the_last_stage(host):
    # hand computation: 126 layers + embedding + loss = 128 = 16 x 8; Megatron's accounting
    # gives the first and the last stage 8 - 1 layers (and the Llama 3 paper did the same)
    w = weights(host, "llama3-405b", 8192)
    assert len(w) == 126
    assert balanced_split(w, 16) == (7,) + (8,) * 14 + (7,)


def test_deepseek_v3_61_layers_split_over_16_stages_by_compute(host):
    w = weights(host, "deepseek-v3", 4096)
    assert len(w) == 61
    dense, moe = set(w[:3]), set(w[3:])
    assert len(dense) == 1 and max(dense) < min(moe)  # dense and MoE layers weigh differently
    split = balanced_split(w, 16)
    # 61 layers + embedding + head = 63 layer-equivalents: 16 chunks of at most 4
    assert len(split) == 16 and sum(split) == 61 and min(split) >= 1
    assert split[0] + 1 <= 4 and split[-1] + 1 <= 4 and max(split) == 4


def test_a_decode_step_of_moe_layers_splits_too(host):
    # issue 26: one token's rows per expert (b*k*s/E = 2/4) were a ValueError; 2 layers on pp2
    # can only split 1, 1, and the layers of one kind weigh alike
    from stage_core.flow import plan_job
    from stage_core.tasks import inference_graph

    spec, config = resolve_model(host, "moe-tiny")
    w = layer_weights(inference_graph(spec.build(config), "decode"), Plan(task="decode", seq_len=1, context_len=64))
    assert len(w) == 2 and w[0] == w[1] > 0
    result = plan_job(host, "moe-tiny", {}, Plan(task="decode", pp=2, stage_layers="auto", context_len=64))
    assert result.manifest["plan"]["stage_layers"] == [1, 1]
