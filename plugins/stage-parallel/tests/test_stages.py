"""Uneven pipeline stages: --stage-layers as given, and auto (balanced by compute, the
embedding and the LM head counted as one layer each, as Megatron counts them)."""

import pytest

from stage_core.api import NodeType, Plan, UsageError, plan_job
from stage_parallel.stages import balanced_split

S, H, A = 32, 64, 4  # the toy's sequence, hidden size and heads
LAYER = S * H * (34 + 5 * A * S // H)  # Korthikanti's activation bytes of one toy layer, b = 1
# the toy's parameters: per layer ln1 2h, qkv 3h*h + 3h, out h*h + h, ln2 2h, fc1 h*f + f, fc2 f*h + h
F, V = 256, 128
LAYER_PARAMS = 2 * H + 3 * H * H + 3 * H + H * H + H + 2 * H + H * F + F + F * H + H
EMBED_PARAMS, FINAL_NORM_PARAMS = V * H, 2 * H


def by_stage(result):
    return [rc for rc in sorted(result.manifest["rank_classes"], key=lambda rc: min(rc["ranks"]))]


def test_megatron_accounting_of_llama3_405b_at_pp16():
    # Megatron: (126 layers + embedding + loss) / 16 = 8 per stage; the first and the last
    # stage give one place to the embedding and to the loss
    assert balanced_split([1] * 126, 16) == (7,) + (8,) * 14 + (7,)


def test_heavier_layers_get_fewer_per_chunk():
    # two layers four times heavier than six others (dense vs MoE): 2 | 6 balances
    # (chunk weights 1.75+8 = 9.75 and 6+1.75 = 7.75; 4 | 4 would give 17.75 and 5.75)
    assert balanced_split([4, 4, 1, 1, 1, 1, 1, 1], 2) == (2, 6)
    assert balanced_split([1] * 8, 2) == (4, 4)
    # without the Megatron extras the heavy pair is alone only when it outweighs the rest
    assert balanced_split([4, 4, 1, 1, 1, 1, 1, 1], 2, first_extra=0, last_extra=0) == (2, 6)
    assert balanced_split([1, 1, 1, 1, 1, 1, 4, 4], 2, first_extra=0, last_extra=0) == (6, 2)


def test_auto_on_the_toy_gives_megatrons_split(host):
    # 6 layers + embedding + head = 8 units over 4 stages: 1, 2, 2, 1
    result = plan_job(host, "toy", {"layers": "6"}, Plan(pp=4, micro_batches=4, stage_layers="auto"))
    assert result.manifest["plan"]["stage_layers"] == [1, 2, 2, 1]
    params = [rc["memory_bytes"]["parameters"] // 2 for rc in by_stage(result)]
    assert params == [EMBED_PARAMS + LAYER_PARAMS, 2 * LAYER_PARAMS, 2 * LAYER_PARAMS,
                      LAYER_PARAMS + FINAL_NORM_PARAMS + EMBED_PARAMS]  # the tied table on the last stage too


@pytest.mark.parametrize("task,lengths", [("decode", {"context_len": 64}), ("prefill", {"seq_len": 32})])
def test_auto_for_inference_tasks_gives_megatrons_split_too(host, task, lengths):
    # issue 26: decode's kernels read ctx (the tokens attended to), which the weights left
    # unbound: a KeyError from the pp strategy; the layers weigh alike, so the split is the
    # training one above, 1, 2, 2, 1
    result = plan_job(host, "toy", {"layers": "6"}, Plan(pp=4, micro_batches=4, stage_layers="auto", task=task,
                                                        **lengths))
    assert result.manifest["plan"]["stage_layers"] == [1, 2, 2, 1]


def test_given_split_moves_memory_flops_and_the_tied_group(traces, host):
    m = 4
    result, ts, ranks = traces(Plan(pp=3, micro_batches=m, stage_layers=(2, 2, 1)), overrides={"layers": "5"})
    stages = by_stage(result)
    assert [rc["memory_bytes"]["parameters"] // 2 for rc in stages] == [
        EMBED_PARAMS + 2 * LAYER_PARAMS, 2 * LAYER_PARAMS, LAYER_PARAMS + FINAL_NORM_PARAMS + EMBED_PARAMS]
    # 1F1B: stage 0 keeps p = 3 micro-batches of its 2 layers (and the embedding's dropout mask)
    assert stages[0]["memory_bytes"]["activations"] == 3 * (2 * LAYER + S * H)
    # the tied embedding's gradients are summed over the first and the last stage
    for rank in (0, 2):
        shared = [n for n in ranks[rank] if n.type == NodeType.COMM_COLL and "grad_sync.shared" in n.name]
        assert len(shared) == 1 and ts.comm_groups[shared[0].attr("pg_name")] == [0, 2]
    # moving one layer between stages moves exactly one layer's step: the difference of
    # two single-GPU models with 5 and 4 layers
    other = plan_job(host, "toy", {"layers": "5"}, Plan(pp=3, micro_batches=m, stage_layers=(1, 2, 2)))
    five = plan_job(host, "toy", {"layers": "5"}, Plan(micro_batches=m))
    four = plan_job(host, "toy", {"layers": "4"}, Plan(micro_batches=m))
    one_layer = five.reports[0].flops["total"] - four.reports[0].flops["total"]
    assert stages[0]["flops"]["total"] - by_stage(other)[0]["flops"]["total"] == one_layer
    assert by_stage(other)[2]["flops"]["total"] - stages[2]["flops"]["total"] == one_layer


def test_interleaved_chunks_take_their_own_counts(traces):
    # chunks in order 0..3, chunk c on stage c % 2: stage 0 runs chunks 0 and 2 (1 + 2 layers)
    result, _, _ = traces(Plan(pp=2, virtual_stages=2, schedule="interleaved", micro_batches=4,
                               stage_layers=(1, 3, 2, 1)), overrides={"layers": "7"})
    params = [rc["memory_bytes"]["parameters"] // 2 for rc in by_stage(result)]
    assert params == [EMBED_PARAMS + 3 * LAYER_PARAMS, 4 * LAYER_PARAMS + FINAL_NORM_PARAMS + EMBED_PARAMS]


@pytest.mark.parametrize("plan,layers,needle", [
    (Plan(pp=2, stage_layers=(3, 1, 1)), 5, "needs 2 layer counts, one per stage in order, summing to the "
                                            "model's 5 layers (got 3 summing to 5)"),
    (Plan(pp=2, stage_layers=(3, 3)), 5, "(got 2 summing to 6); or --stage-layers auto"),
    (Plan(pp=2, virtual_stages=2, schedule="interleaved", micro_batches=2, stage_layers=(3, 2)), 5,
     "--pp 2 x --virtual-stages 2 needs 4 layer counts"),
    (Plan(pp=3), 5, "valid --pp: 1, 5; or give --stage-layers auto"),
    (Plan(pp=4, stage_layers="auto"), 3, "4 stages for 3 layers; every stage needs at least one layer"),
    (Plan(stage_layers=(5,)), 5, "--stage-layers 5: needs --pp above 1"),
    (Plan(pp=3, stage_layers=(3, 0, 2)), 5, "--stage-layers 3,0,2: expected auto or one layer count per stage, "
                                            "comma-separated (e.g. 7,8,8,7): positive, but the first and last may "
                                            "be 0"),
])
def test_wrong_splits_are_refused_in_one_line(host, plan, layers, needle):
    with pytest.raises(UsageError) as err:
        plan_job(host, "toy", {"layers": str(layers)}, plan)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_first_chunk_of_the_embedding_alone_and_a_last_of_the_head_alone(traces):
    # Llama 3's balance (arXiv 2407.21783 section 3.3.2): one layer fewer on the first and last stage, so
    # with one-layer chunks the first chunk is the embedding alone and the last the head alone. Toy, 4
    # layers, pp 2 x 2 chunks as 0, 2, 2, 0: stage 0 runs chunks 0 (embedding) and 2, stage 1 chunks 1 and 3
    m = 4
    result, ts, ranks = traces(Plan(pp=2, virtual_stages=2, schedule="interleaved", micro_batches=m,
                                    stage_layers=(0, 2, 2, 0)), overrides={"layers": "4"})
    stages = by_stage(result)
    assert result.manifest["plan"]["stage_layers"] == [0, 2, 2, 0]
    assert [rc["memory_bytes"]["parameters"] // 2 for rc in stages] == [
        EMBED_PARAMS + 2 * LAYER_PARAMS, 2 * LAYER_PARAMS + FINAL_NORM_PARAMS + EMBED_PARAMS]
    # three chunk boundaries cross stages; each stage sends three activations (or their gradients) of
    # s x b x h bf16 per micro-batch: stage 0 chunk 0 -> 1 and 2 -> 3 forward, 2 -> 1 backward
    assert [rc["comm_bytes"]["send"] for rc in stages] == [3 * m * S * H * 2] * 2


def test_stage_layers_spell_repeats_as_n_x_k():
    from stage_core.api import plan_from_flags

    plan = plan_from_flags(["--pp", "16", "--stage-layers", "7,8x14,7"]).plan
    assert plan.stage_layers == (7,) + (8,) * 14 + (7,)  # Megatron's 405B split, as test_megatron_accounting
    assert plan_from_flags(["--pp", "16", "--virtual-stages", "8", "--stage-layers", "0,1x126,0"]).plan.stage_layers \
        == (0,) + (1,) * 126 + (0,)
