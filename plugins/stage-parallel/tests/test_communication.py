"""Communication read back from written traces against REFERENCE §3 (Megatron, ZeRO)."""

from collections import Counter

import pytest

from stage_core.api import CollectiveType as C, NodeType, Plan, param_counts

TOY = {"layers": "3"}  # toy: h 64, 4 heads, f 256, V 128, s 32


def collectives(nodes, groups, rank, name_part=""):
    out = []
    for n in nodes:
        if n.type == NodeType.COMM_COLL and name_part in n.name:
            out.append((C(n.attr("comm_type")), n.attr("comm_size"), len(groups[n.attr("pg_name")]), n.name))
    return out


@pytest.mark.parametrize("m", [1, 3])
def test_tp_without_sp_four_all_reduces_of_sbh2_per_layer_per_micro_batch(traces, m):
    result, ts, ranks = traces(Plan(tp=4, micro_batches=m), overrides=TOY)
    s, b, h = 32, 1, 64
    for rank, nodes in ranks.items():
        layer = collectives(nodes, ts.comm_groups, rank, ".layers.")
        assert Counter((k, size, n) for k, size, n, _ in layer) == {(C.ALL_REDUCE, s * b * h * 2, 4): 4 * 3 * m}
        # two in forward (after attention, after the MLP), two in backward
        assert sum(".fwd." in name for *_, name in layer) == 2 * 3 * m


def test_tp_without_sp_megatron_example_size():
    # REFERENCE §3: h=5120, s=2048, b=1 -> 20,971,520 bytes per all-reduce
    assert 2048 * 1 * 5120 * 2 == 20_971_520


def test_tp_with_sp_all_gather_and_reduce_scatter_pairs(traces):
    result, ts, ranks = traces(Plan(tp=4, sp=True), overrides=TOY)
    s, b, h, t = 32, 1, 64, 4
    for rank, nodes in ranks.items():
        layer = collectives(nodes, ts.comm_groups, rank, ".layers.")
        kinds = Counter(k for k, *_ in layer)
        # each of the 4 all-reduces becomes a reduce-scatter (full s*b*h*2 input) and an
        # all-gather (s*b*h*2/t shard per rank: the same s*b*h*2 payload gathered); the
        # backward also re-gathers the two column-parallel inputs for the weight gradients
        # instead of keeping them (Korthikanti et al. 2022 §4.2.2)
        assert kinds == {C.REDUCE_SCATTER: 4 * 3, C.ALL_GATHER: 6 * 3}
        assert {size for k, size, *_ in layer if k == C.REDUCE_SCATTER} == {s * b * h * 2}
        assert {size * t for k, size, *_ in layer if k == C.ALL_GATHER} == {s * b * h * 2}
        regather = [name for k, _, _, name in layer if k == C.ALL_GATHER and "bwd.wgrad" in name]
        assert len(regather) == 2 * 3


@pytest.mark.parametrize("m", [1, 4])
def test_dp_one_all_reduce_of_the_gradients_per_step(traces, m):
    result, ts, ranks = traces(Plan(dp=4, micro_batches=m), overrides=TOY)
    psi = param_counts(result.forward)[0]
    for rank, nodes in ranks.items():
        sync = collectives(nodes, ts.comm_groups, rank)
        assert {(k, n) for k, _, n, _ in sync} == {(C.ALL_REDUCE, 4)}
        assert sum(size for _, size, _, _ in sync) == 2 * psi  # bf16 gradients, once


def test_dp_buckets_overlap_the_backward(traces):
    plan = Plan(dp=2, bucket_params=20_000)
    result, ts, ranks = traces(plan, overrides=TOY)
    nodes = ranks[0]
    sync = [n for n in nodes if n.type == NodeType.COMM_COLL]
    assert len(sync) > 2
    last_backward = max(n.id for n in nodes if ".bwd." in n.name)
    # the first bucket is issued, and can run, while the backward goes on
    first = sync[0]
    assert first.id < last_backward
    assert all(".bwd." in nodes[d].name for d in first.data_deps)
    assert max(first.data_deps) < last_backward


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_1_and_2_reduce_scatter_gradients_and_all_gather_parameters(traces, stage):
    dp = 4
    result, ts, ranks = traces(Plan(dp=dp, zero=stage), overrides=TOY)
    psi = param_counts(result.forward)[0]
    padded = -(-psi // dp) * dp
    for rank, nodes in ranks.items():
        sync = collectives(nodes, ts.comm_groups, rank)
        rs = [size for k, size, *_ in sync if k == C.REDUCE_SCATTER]
        ag = [size for k, size, *_ in sync if k == C.ALL_GATHER]
        assert sum(rs) == 2 * padded  # the full bf16 gradient is the input
        assert sum(ag) == 2 * padded // dp  # each rank contributes its updated shard
        assert not [k for k, *_ in sync if k == C.ALL_REDUCE]


def test_zero_3_gathers_each_parameter_on_its_own_with_zero_gather_parameter(traces):
    """DeepSpeed's ZeRO-3 fetches parameters one tensor at a time: one all-gather per parameter
    tensor (its shard), before forward and again before backward; the same bytes as one per layer."""
    dp = 4
    plan = Plan(dp=dp, zero=3, options=(("zero-gather", "parameter"),))
    result, ts, ranks = traces(plan, overrides=TOY)
    psi = param_counts(result.forward)[0]
    gathers = [n for n in ranks[0] if n.type == NodeType.COMM_COLL and C(n.attr("comm_type")) == C.ALL_GATHER]
    tensors = len(result.forward.params)
    assert len(gathers) == 2 * tensors  # (a tied embedding and head: one tensor, gathered once each way)
    assert sum(n.attr("comm_size") for n in gathers) == 2 * (2 * psi // dp)
    per_layer = Counter(n.name.split(":")[0] for n in gathers if ".fwd.layer0" in n.name)
    layer0 = [p for p in result.forward.params if ".0." in p.name or p.name.startswith("layers.0")]
    assert sum(per_layer.values()) == len(layer0) > 1


def test_zero_3_gathers_each_layer_before_forward_and_backward(traces):
    dp = 4
    result, ts, ranks = traces(Plan(dp=dp, zero=3), overrides=TOY)
    psi = param_counts(result.forward)[0]
    nodes = ranks[0]
    gathers = [n for n in nodes if n.type == NodeType.COMM_COLL and C(n.attr("comm_type")) == C.ALL_GATHER]
    # 3 layers + the embedding/head unit, each gathered before its forward and its backward
    assert len(gathers) == 2 * (3 + 1)
    assert sum(n.attr("comm_size") for n in gathers) == 2 * (2 * psi // dp)
    rs = [n for n in nodes if n.type == NodeType.COMM_COLL and C(n.attr("comm_type")) == C.REDUCE_SCATTER]
    assert sum(n.attr("comm_size") for n in rs) == 2 * psi
    # about 1.5x the data-parallel volume in ring terms: RS (n-1)/n*S, 2 AGs (n-1)/n*S each
    ring = lambda s: (dp - 1) / dp * s  # noqa: E731
    zero3 = ring(sum(n.attr("comm_size") for n in rs)) + sum(ring(n.attr("comm_size") * dp) for n in gathers)
    assert zero3 / (2 * ring(2 * psi)) == pytest.approx(1.5)
    for layer in range(3):
        fwd_gather = next(n for n in gathers if f"fwd.layer{layer}" in n.name)
        first_use = min(n.id for n in nodes if n.name.startswith(f"mb0.fwd.layers.{layer}."))
        assert fwd_gather.id < first_use


@pytest.mark.parametrize("pp", [1, 2])
def test_zero_3_without_resharding_gathers_each_layer_once_per_step(traces, pp):
    # Llama 3's FSDP (arXiv 2407.21783 section 3.3.2): weights gathered at their first use in the
    # step and kept, not gathered again for backward or the next micro-batch; gradients
    # reduce-scattered once as ZeRO-3's
    dp, m = 4, 3
    plan = Plan(dp=dp, zero=3, pp=pp, micro_batches=m, stage_layers=(1, 2) if pp == 2 else None)
    kept, ts, ranks = traces(plan.with_options(zero_reshard=False), overrides=TOY)
    resharded, ts3, ranks3 = traces(plan, overrides=TOY)
    psi = param_counts(kept.forward)[0]
    gathered = rs_total = 0
    for stage, rc in enumerate(kept.manifest["rank_classes"]):
        nodes = ranks[rc["ranks"][0]]
        gathers = [n for n in nodes if n.type == NodeType.COMM_COLL and C(n.attr("comm_type")) == C.ALL_GATHER]
        units = {n.name.split(":")[0].split(".")[-1] for n in gathers}  # layer0, ..., outside_layers
        assert len(gathers) == len(units)  # one gather a unit, in micro-batch 0's forward
        assert all(n.name.startswith("mb0.") and ".fwd." in n.name for n in gathers)
        gathered += sum(n.attr("comm_size") for n in gathers)
        rs_total += sum(n.attr("comm_size") for n in nodes if n.type == NodeType.COMM_COLL
                        and C(n.attr("comm_type")) == C.REDUCE_SCATTER)
        # the next micro-batches and a layer's backward (its input gradients) read the kept copy:
        # they wait on its gather (the embedding's backward reads no weight)
        for g in gathers:
            readers = [n for n in nodes if g.id in n.data_deps]
            assert {r.name.split(".")[0] for r in readers} == {f"mb{k}" for k in range(m)}
            assert ".layer" not in g.name or any(".bwd." in r.name for r in readers)
    # each rank's bf16 shard, once; the toy's tied embedding (V x h = 128 x 64) is held, gathered and
    # reduced by the first and the last stage both
    tied = 128 * 64 if pp == 2 else 0
    assert gathered == 2 * (psi + tied) // dp
    assert rs_total == 2 * (psi + tied)
    # ring volume: RS + one AG = the data-parallel all-reduce's (1x); ZeRO-3 resharding: RS + 2m AGs
    ring = lambda s: (dp - 1) / dp * s  # noqa: E731
    dp_volume = 2 * ring(2 * (psi + tied))
    assert (ring(rs_total) + ring(gathered * dp)) / dp_volume == pytest.approx(1.0)
    ag3 = sum(rc["comm_bytes"]["all_gather"] for rc in resharded.manifest["rank_classes"])
    assert (ring(rs_total) + ring(ag3 * dp)) / dp_volume == pytest.approx((1 + 2 * m) / 2)
