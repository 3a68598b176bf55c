"""MoE layers under parallel plans: routed tokens, capacity, tensor and expert parallel.

Numbers come from hand computations: a dropless expert processes its tokens·k/E share
of the routed rows (whole rows: some experts one more than others, the total exactly
tokens·k); with a capacity factor every expert is padded to Megatron's capacity
⌈tokens·k·cf/E⌉ of each rank's tokens; a SwiGLU expert costs 3 matmuls of 2·h·fe
FLOPs per row forward and twice that backward.
"""

import json
import math

import pytest

from stage_core.flow import plan_job
from stage_core.errors import UsageError
from stage_core.models import param_counts
from stage_core.parallel import Plan
from stage_core.trace import CollectiveType as C

MIXTRAL = {"h": 4096, "fe": 14336, "E": 8, "k": 2}
DEEPSEEK = {"h": 7168, "fe": 2048, "E": 256, "k": 8}


def expert_matmul_flops(result):
    """Matmul FLOPs of the routed experts' kernels on the first rank class."""
    (prog, *_) = result.job.programs
    return sum(n.num_ops for n in prog.nodes if n.comm_type is None and ".moe.experts." in n.name
               and n.flops_kind == "matmul")


def swiglu_expert_flops(rows, m):
    # gate, up, down: 2·rows·h·fe each forward; backward twice forward
    return 3 * 3 * 2 * rows * m["h"] * m["fe"]


@pytest.mark.parametrize("model,m,seq,dense", [("mixtral-8x7b", MIXTRAL, 1001, 0), ("deepseek-v3", DEEPSEEK, 1000, 3)])
def test_any_sequence_length_routes_whole_tokens(host, model, m, seq, dense):
    # 1001·2/8 and 1000·8/256 are not whole: experts get floor or ceiling shares, the
    # total is exactly tokens·k rows per MoE layer
    result = plan_job(host, model, {"layers": str(dense + 2)}, Plan(seq_len=seq))
    assert expert_matmul_flops(result) == 2 * swiglu_expert_flops(seq * m["k"], m)


@pytest.mark.parametrize("dp", [1, 2])
def test_capacity_factor_pads_every_expert_to_megatrons_rounded_up_capacity(host, dp):
    seq, cf, m = 1001, 1.1, MIXTRAL
    result = plan_job(host, "mixtral-8x7b", {"layers": "1", "capacity_factor": str(cf)},
                      Plan(seq_len=seq, dp=dp))
    capacity = math.ceil(seq * m["k"] * cf / m["E"])  # 276, from each rank's own 1001 tokens
    assert capacity == 276
    assert expert_matmul_flops(result) == swiglu_expert_flops(m["E"] * capacity, m)


def test_moe_tp_with_sp_at_micro_batch_one(host, write_set, simulate):
    # the slots split over tp follow the sequence (SP), not the micro-batch of 1
    plan = Plan(tp=2, sp=True, seq_len=256, micro_batch_size=1)
    result = plan_job(host, "mixtral-8x7b", {"layers": "2"}, plan)
    whole = plan_job(host, "mixtral-8x7b", {"layers": "2"}, Plan(seq_len=256))
    (rc,) = result.manifest["rank_classes"]
    (one,) = whole.manifest["rank_classes"]
    assert 2 * rc["flops"]["matmul"] == one["flops"]["matmul"]
    out = write_set("mixtral-8x7b", plan, layers=2)
    status, results = simulate(out)
    assert results["summary"]["finished_ranks"] == 2 and status == 0


# --------------------------------------------------------------------------- tensor parallel reductions (6b)

T = 4096  # mixtral-8x7b's sequence, micro-batch 1


def tp_collectives(result, where=""):
    (prog,) = result.job.programs
    return [n for n in prog.nodes if n.comm_type is not None and n.group == "tp" and where in n.name]


def test_moe_tp_reduces_each_token_once_each_way(host):
    # Without SP the TP ranks hold the same tokens: the experts' partial outputs pass
    # through the combine and are reduced once per token (with the rest of the layer),
    # and so are the input gradients; the routing weights' gradient, computed from the
    # partial expert outputs, is one small all-reduce of tokens x E fp32.
    m = MIXTRAL
    result = plan_job(host, "mixtral-8x7b", {}, Plan(tp=2, dp=2))
    row = T * m["h"] * 2
    per_layer = 4 * row + T * m["E"] * 4
    # outside the layers: vocab-parallel embedding (forward) and head input gradient
    # (backward), one token row each; cross-entropy's three [tokens] fp32 all-reduces
    outside = 2 * row + 3 * T * 4
    assert sum(n.comm_size for n in tp_collectives(result)) == 32 * per_layer + outside == 4_366_319_616
    # nothing of the experts' [E, c, h] rows is reduced, in forward or backward
    assert not [n for n in tp_collectives(result, ".moe.") if n.comm_size > row]


def test_moe_tp_with_sp_reduces_expert_rows_once_in_forward(host):
    # With SP the expert TP ranks hold different tokens (Megatron's alltoall dispatcher):
    # slots all-gathered before the experts, partial outputs reduce-scattered before the
    # combine -- once: the combine's backward reads the reduced rows the forward kept
    m = MIXTRAL
    result = plan_job(host, "mixtral-8x7b", {"layers": "1"}, Plan(tp=2, sp=True, seq_len=1024))
    rows = 1024 * m["k"] * m["h"] * 2  # the slots of all the TP group's tokens
    moe = tp_collectives(result, ".layers.0.moe.")
    kinds = sorted((n.name.split(":")[0].split(".", 2)[2], n.comm_type.name, n.comm_size) for n in moe)
    assert kinds == sorted([
        ("layers.0.moe.experts.gate", "ALL_GATHER", rows // 2),  # forward: slots gathered
        ("layers.0.moe.combine", "REDUCE_SCATTER", rows),  # forward: partial rows, once
        ("layers.0.moe.combine.bwd", "ALL_GATHER", rows // 2),  # backward: conjugate of the scatter
        ("layers.0.moe.experts.up.bwd.wgrad", "ALL_GATHER", rows // 2),  # re-gather for gate/up weights
        ("layers.0.moe.dispatch.bwd", "REDUCE_SCATTER", rows),  # backward: conjugate of the gather
    ])


# --------------------------------------------------------------------------- expert parallel (point 3)

MIXTRAL_EXPERT_PARAMS = 3 * 8 * 4096 * 14336 * 32  # gate, up, down of 8 experts in 32 layers


def collectives(result, kind=None):
    (prog, *_) = result.job.programs
    return [n for n in prog.nodes if n.comm_type is not None and (kind is None or n.comm_type == kind)]


def model_flops(result):
    """Forward and backward FLOPs of the first rank class (all kernels but the optimizer step)."""
    (prog, *_) = result.job.programs
    return sum(n.num_ops for n in prog.nodes if n.comm_type is None and n.type.name == "COMP"
               and not n.name.startswith("optimizer."))


def test_mixtral_ep8_all_to_all_volumes_by_hand(host):
    # dp8 ep8: every rank routes its 4,096 tokens' 2 rows each to the expert on the rank
    # that holds it: per MoE layer and micro-batch, all-to-alls in dispatch and combine,
    # forward and backward, each of T·k·h·2 bytes per rank (REFERENCE §3), 7/8 of it
    # leaving the GPU under uniform routing
    m = MIXTRAL
    result = plan_job(host, "mixtral-8x7b", {}, Plan(dp=8, ep=8, micro_batches=2))
    a2a = collectives(result, C.ALL_TO_ALL)
    per = T * m["k"] * m["h"] * 2
    assert per == 67_108_864
    assert len(a2a) == 4 * 32 * 2 and {n.comm_size for n in a2a} == {per}
    groups = result.job.comm_groups
    assert {len(groups[result.job.group_name(0, n.group)]) for n in a2a} == {8}
    assert sum(n.comm_size for n in a2a) * 7 // 8 == 15_032_385_536  # bytes leaving each GPU per step


def test_raising_ep_keeps_flops_and_divides_expert_parameters(host):
    # at fixed dp8 and uniform routing each rank runs its own tokens' k rows whatever
    # the experts it holds: the same forward and backward FLOPs at ep 1, 2, 8; the
    # experts' weights (and their optimizer step) divide by ep
    total = param_counts(plan_job(host, "mixtral-8x7b", {}, Plan()).forward)[0]
    dense = total - MIXTRAL_EXPERT_PARAMS
    runs = {ep: plan_job(host, "mixtral-8x7b", {}, Plan(dp=8, ep=ep)) for ep in (1, 2, 8)}
    flops = {ep: model_flops(r) for ep, r in runs.items()}
    assert flops[1] == flops[2] == flops[8]
    for ep, r in runs.items():
        (rc,) = r.manifest["rank_classes"]
        assert rc["memory_bytes"]["parameters"] == 2 * (dense + MIXTRAL_EXPERT_PARAMS // ep)
    (one,), (eight,) = runs[1].manifest["rank_classes"], runs[8].manifest["rank_classes"]
    assert one["flops"]["matmul"] == eight["flops"]["matmul"]
    # Adam: 15 FLOPs per local parameter (kernels.ADAM_FLOPS)
    assert one["flops"]["total"] - eight["flops"]["total"] == 15 * MIXTRAL_EXPERT_PARAMS * 7 // 8


def test_expert_gradients_reduce_over_the_expert_data_parallel_group(host):
    # dp8 ep2: experts' gradients over edp = 8/2 = 4 ranks, the rest over dp 8 (bf16)
    result = plan_job(host, "mixtral-8x7b", {}, Plan(dp=8, ep=2, seq_len=512))
    total = param_counts(result.forward)[0]
    groups, name = result.job.comm_groups, result.job.group_name
    sync = [n for n in collectives(result, C.ALL_REDUCE) if n.name.startswith("grad_sync")]
    by_size = {}
    for n in sync:
        size = len(groups[name(0, n.group)])
        by_size[size] = by_size.get(size, 0) + n.comm_size
    assert by_size == {4: 2 * MIXTRAL_EXPERT_PARAMS // 2, 8: 2 * (total - MIXTRAL_EXPERT_PARAMS)}


@pytest.mark.parametrize("ep,imbalance", [(8, 1.5), (2, 2.0)])
def test_imbalance_sizes_every_rank_as_the_busiest(host, ep, imbalance):
    # the busiest expert gets imbalance x its share A = ep·T·k/E, the other E-1 share the
    # rest; the rank holding it runs E/ep experts: rows = imbalance·A + (E/ep - 1)(ep·T·k
    # - imbalance·A)/(E - 1), rounded up
    m, seq = MIXTRAL, 1024
    plan = Plan(dp=8, ep=ep, seq_len=seq, moe_imbalance=imbalance)
    result = plan_job(host, "mixtral-8x7b", {"layers": "1"}, plan)
    tk, E = seq * m["k"], m["E"]
    share = ep * tk / E
    rows = math.ceil(imbalance * share + (E // ep - 1) * (ep * tk - imbalance * share) / (E - 1))
    assert rows == {8: 3072, 2: 2341}[ep]
    assert expert_matmul_flops(result) == swiglu_expert_flops(rows, m)
    assert {n.comm_size for n in collectives(result, C.ALL_TO_ALL)} == {rows * m["h"] * 2}


def test_capacity_factor_flag_scales_the_all_to_all(host):
    # --moe-capacity-factor 1.25: each rank pads every expert to ceil(1024·2·1.25/8) = 320 rows
    m = MIXTRAL
    result = plan_job(host, "mixtral-8x7b", {"layers": "1"}, Plan(dp=8, ep=8, seq_len=1024,
                                                                   moe_capacity_factor=1.25))
    assert {n.comm_size for n in collectives(result, C.ALL_TO_ALL)} == {8 * 320 * m["h"] * 2}
    assert expert_matmul_flops(result) == swiglu_expert_flops(8 * 320, m)


def test_allgather_dispatcher_moves_tokens_not_routed_rows(host):
    # Megatron's allgather dispatcher: all-gather the tokens (and routing weights) of the
    # ep group, reduce-scatter the outputs back: T·h·2 per rank in, ep·T·h·2 back
    m, seq, ep = MIXTRAL, 1024, 4
    result = plan_job(host, "mixtral-8x7b", {"layers": "1"},
                      Plan(dp=8, ep=ep, seq_len=seq, moe_dispatcher="allgather"))
    moe = [n for n in collectives(result) if ".moe." in n.name]
    got = sorted((n.name.split(":")[0].split(".", 2)[2], n.comm_type.name, n.comm_size) for n in moe)
    tokens, weights = seq * m["h"] * 2, seq * m["E"] * 4
    assert got == sorted([
        ("layers.0.moe.dispatch", "ALL_GATHER", tokens), ("layers.0.moe.dispatch", "ALL_GATHER", weights),
        ("layers.0.moe.combine", "REDUCE_SCATTER", ep * tokens),
        ("layers.0.moe.combine.bwd", "ALL_GATHER", tokens), ("layers.0.moe.combine.bwd", "REDUCE_SCATTER", ep * weights),
        ("layers.0.moe.dispatch.bwd", "REDUCE_SCATTER", ep * tokens),
    ])
    single = plan_job(host, "mixtral-8x7b", {"layers": "1"}, Plan(dp=8, seq_len=seq))
    assert expert_matmul_flops(result) == expert_matmul_flops(single)


EP_SETS = [
    ("moe-tiny", Plan(dp=4, ep=4, micro_batches=2)),
    ("moe-tiny", Plan(dp=4, ep=2, zero=1, micro_batches=2)),
    ("moe-tiny", Plan(tp=2, sp=True, dp=2, ep=2, micro_batches=2)),
    ("moe-tiny", Plan(tp=2, dp=2, ep=2, pp=2, micro_batches=4, moe_dispatcher="allgather")),
    ("moe-tiny", Plan(tp=2, sp=True, dp=4, ep=4, etp=1, zero=3, micro_batches=2)),
    ("moe-mla-tiny", Plan(tp=2, dp=2, ep=2, pp=2, micro_batches=2, stage_layers="auto", moe_imbalance=1.5)),
]


@pytest.mark.parametrize("model,plan", EP_SETS, ids=lambda x: x if isinstance(x, str) else None)
def test_expert_parallel_sets_finish_in_the_simulator(write_set, simulate, model, plan):
    out = write_set(model, plan)
    status, results = simulate(out)
    summary = results["summary"]
    assert summary["deadlocked_ranks"] == [] and summary["finished_ranks"] == plan.world_size, summary
    assert status == 0


@pytest.mark.parametrize("plan,needle", [
    (Plan(tp=2, dp=4, ep=4, etp=1), "--etp 1 without --sp: the TP ranks hold the same tokens"),
    (Plan(dp=16, ep=16), "--ep 16: the 8 experts must split evenly over ep; valid --ep: 1, 2, 4, 8"),
    (Plan(dp=4, ep=4, pp=2, order="tp-cp-ep-pp-dp"), "--order tp-cp-ep-pp-dp: with pp before dp the expert "
                                                     "layers' data-parallel degree (edp 1) must equal dp (4)"),
    (Plan(tp=4, etp=3), "--etp 3: expert layers split tp*cp*dp = 4 ranks into etp x ep x edp, so etp must "
                        "divide 4 (valid --etp: 1, 2, 4)"),
    (Plan(tp=2, dp=3, sp=True, etp=3), "--etp 3: expert tensor parallel needs it to divide fe = 14336; "
                                       "valid --etp: 1, 2, 4, 7, 8"),
])
def test_expert_plans_refused_in_one_line(host, plan, needle):
    with pytest.raises(UsageError) as err:
        plan_job(host, "mixtral-8x7b", {"layers": "1"}, plan.replace(seq_len=256))
    assert needle in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- five dimensions

@pytest.mark.parametrize("cp_comm", ["p2p", "all-gather", "a2a"])
def test_five_dimensions_with_uneven_stages_finish_in_the_simulator(write_set, simulate, cp_comm):
    # tp, cp, ep, pp, dp all 2 (16 ranks; ep carved out of dp x cp: in the default order
    # the ep groups are the cp groups), 3 layers as 1 + 2, under each CP algorithm
    plan = Plan(tp=2, sp=True, cp=2, cp_comm=cp_comm, ep=2, pp=2, dp=2, stage_layers=(1, 2), micro_batches=4,
                seq_len=64)
    out = write_set("moe-tiny", plan, layers=3, kv_heads=4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 16 and manifest["plan"]["stage_layers"] == [1, 2]
    status, results = simulate(out)
    summary = results["summary"]
    assert summary["deadlocked_ranks"] == [] and summary["finished_ranks"] == 16, summary
    assert status == 0


def test_published_mixtral_plan_all_to_all_by_hand():
    # mixtral-8x7b-megatron: pp4 x 8 virtual stages of one layer, so 8 MoE layers per rank;
    # 256 sequences over dp16 = 16 micro-batches; 4 all-to-alls of T·k·h·2 per layer and
    # micro-batch over the ep8 group (carved out of dp16: edp 2)
    from stage_core.planning import plan_from_settings
    from stage_core.plugins import PluginHost

    host = PluginHost()
    req = plan_from_settings({"plan": "mixtral-8x7b-megatron"}, host)
    model, overrides, plan = req.model, req.overrides, req.plan
    assert (plan.ep, plan.dp, plan.expert_dp, plan.world_size) == (8, 16, 2, 64)
    result = plan_job(host, model, overrides, plan, programs=False)
    per = T * MIXTRAL["k"] * MIXTRAL["h"] * 2
    for rc in result.manifest["rank_classes"]:
        assert rc["comm_bytes"]["all_to_all"] == 8 * 16 * 4 * per == 34_359_738_368
