"""Context parallel against hand computations: each algorithm's volumes per layer
(docs/context-parallel.md), the gradient reduction over dp x cp, and the causal load
balance of the 2·cp chunks."""

import re

import pytest

from stage_core.api import CollectiveType, NodeType, Plan, UsageError, plan_job

S, H, A, D = 32, 64, 4, 16  # the toy: sequence, hidden, heads (= query groups), head dim
FLASH = {"attention": "flash"}
A8, D8 = 8, 8  # with --set heads=8, so that 8 heads split over cp x tp = 8


def layer_nodes(nodes, phase_tag="mb0."):
    """The nodes of layer 0 of micro-batch 0."""
    return [n for n in nodes if n.name.startswith(phase_tag) and ".layers.0." in n.name]


def volumes(nodes, axis="cp"):
    """comm_size per collective type on ``axis`` and per ring direction, with node counts."""
    out = {}
    for n in nodes:
        if n.type == NodeType.COMM_COLL and re.search(rf":[a-z_]+\.{axis}(:|$)", n.name):
            key = CollectiveType(n.attr("comm_type")).name
        elif n.type == NodeType.COMM_SEND and ":ring" in n.name:
            key = "SEND"
        else:
            continue
        size, count = out.get(key, (0, 0))
        out[key] = (size + n.attr("comm_size"), count + 1)
    return out


@pytest.mark.parametrize("cp,tp", [(2, 1), (4, 1), (2, 2), (4, 2)])
@pytest.mark.parametrize("comm", ["p2p", "all-gather", "a2a"])
def test_volumes_per_layer_follow_the_formulas(traces, cp, tp, comm):
    b, g = 1, A8  # the toy's attention is multi-head: g = a
    K = b * (S // cp) * (g // tp) * D8 * 2  # the local K (or V) block, bf16
    Q = b * (S // cp) * (A8 // tp) * D8 * 2  # the local queries (and the attention output)
    expected = {
        # ring: cp-1 K/V blocks forward; backward K/V, K/V + dK/dV x (cp-2), dK/dV
        "p2p": {"SEND": (2 * K * (cp - 1) + (2 * K + 4 * K * (cp - 2) + 2 * K), (cp - 1) + cp)},
        # Llama 3: all-gather K and V (forward, and again in backward), reduce-scatter dK and dV
        "all-gather": {"ALL_GATHER": (2 * K + 2 * K, 4), "REDUCE_SCATTER": (2 * cp * K, 2)},
        # Ulysses: q, k, v to heads and the output back; the same for the gradients
        "a2a": {"ALL_TO_ALL": (4 * Q + 4 * K, 8)},
    }[comm]
    plan = Plan(cp=cp, tp=tp, sp=tp > 1, cp_comm=comm, micro_batches=2)
    _, _, ranks = traces(plan, overrides={**FLASH, "heads": "8"})
    for rank, nodes in ranks.items():
        assert volumes(layer_nodes(nodes)) == expected, rank


def test_classic_attention_takes_all_gather_and_a2a_the_same_way(traces):
    K = (S // 2) * A * D * 2
    _, _, ranks = traces(Plan(cp=2, cp_comm="all-gather"))
    assert volumes(layer_nodes(ranks[0])) == {"ALL_GATHER": (4 * K, 4), "REDUCE_SCATTER": (4 * K, 2)}
    _, _, ranks = traces(Plan(cp=2, cp_comm="a2a"))
    assert volumes(layer_nodes(ranks[0])) == {"ALL_TO_ALL": (8 * K, 8)}


def test_ring_messages_go_to_the_next_rank_forward_and_the_previous_backward(traces):
    cp = 4
    _, _, ranks = traces(Plan(cp=cp, dp=2, cp_comm="p2p", micro_batches=1), overrides=FLASH)
    for rank, nodes in ranks.items():
        coord, base = rank % cp, rank - rank % cp  # order tp-cp-ep-dp-pp: cp neighbours are adjacent
        for n in layer_nodes(nodes):
            if n.type == NodeType.COMM_SEND:
                step = 1 if ".fwd." in n.name else -1
                assert n.attr("comm_dst") == base + (coord + step) % cp
            elif n.type == NodeType.COMM_RECV:
                step = -1 if ".fwd." in n.name else 1
                assert n.attr("comm_src") == base + (coord + step) % cp


def test_gradients_reduce_over_dp_x_cp_and_zero_shards_over_both(traces, host):
    params = plan_job(host, "toy", {}, Plan()).reports[0].memory_bytes["parameters"] // 2
    cp, dp = 2, 2
    result, ts, ranks = traces(Plan(cp=cp, dp=dp, cp_comm="all-gather"))
    syncs = [n for n in ranks[0] if n.name.startswith("grad_sync")]
    assert sum(n.attr("comm_size") for n in syncs) == 2 * params  # bf16 gradients, all-reduced
    assert {tuple(ts.comm_groups[n.attr("pg_name")]) for n in syncs} == {(0, 1, 2, 3)}
    result, ts, ranks = traces(Plan(cp=cp, dp=dp, zero=1, cp_comm="all-gather"))
    syncs = [n for n in ranks[0] if n.name.startswith("grad_sync")]
    assert {CollectiveType(n.attr("comm_type")) for n in syncs} == {CollectiveType.REDUCE_SCATTER}
    assert result.reports[0].memory_bytes["optimizer"] == 12 * params // (dp * cp)  # ZeRO-1 over dp x cp
    # cp alone is enough for ZeRO (Megatron's distributed optimizer shards over dp x cp)
    result, _, _ = traces(Plan(cp=cp, zero=1, cp_comm="all-gather"))
    assert result.reports[0].memory_bytes["optimizer"] == 12 * params // cp


@pytest.mark.parametrize("comm", ["p2p", "all-gather", "a2a"])
def test_matmul_flops_summed_over_cp_ranks_are_the_one_device_step(host, comm):
    one = plan_job(host, "toy", FLASH, Plan(micro_batches=2)).reports[0].flops["matmul"]
    cp = 4
    result = plan_job(host, "toy", FLASH, Plan(cp=cp, cp_comm=comm, micro_batches=2))
    assert sum(r.flops["matmul"] * len(r.ranks) for r in result.reports) == one


def causal_pairs(q_chunks, k_chunks, c):
    """(query, key) pairs a causal mask keeps between chunks of c tokens, counting a
    diagonal block as c²/2 (the s²/2 convention of causal FLOP counts)."""
    return sum(c * c if j < i else c * c / 2 if j == i else 0 for i in q_chunks for j in k_chunks)


def test_balanced_chunks_give_every_rank_and_every_ring_step_the_same_causal_work(host):
    cp, b = 4, 1
    c = S // (2 * cp)
    chunks = {r: (r, 2 * cp - 1 - r) for r in range(cp)}
    # every rank: the same share of the s²/2 pairs; every ring step (keys from rank r - i): 2c²
    for r in range(cp):
        assert causal_pairs(chunks[r], range(2 * cp), c) == S * S / 2 / cp
        for i in range(cp):
            assert causal_pairs(chunks[r], chunks[(r - i) % cp], c) == 2 * c * c
    # a contiguous split would not be balanced: rank cp-1 does 2cp-1 times rank 0's work
    contiguous = [causal_pairs((2 * r, 2 * r + 1), range(2 * cp), c) for r in range(cp)]
    assert contiguous[-1] == (2 * cp - 1) * contiguous[0]
    # the trace: each of the cp ring steps of the forward kernel costs 2c² pairs of
    # Q·Kᵀ and P·V (2·d FLOPs each) and the softmax (7), per head
    result = plan_job(host, "toy", {**FLASH, "causal_flops": "true"}, Plan(cp=cp, cp_comm="p2p"))
    (program,) = result.job.programs
    steps = [n for n in program.nodes if n.name.startswith("mb0.fwd.layers.0.attn.flash:ring")
             and n.type == NodeType.COMP]
    assert len(steps) == cp
    assert {n.num_ops for n in steps} == {2 * c * c * b * A * (2 * D + 2 * D + 7)}


@pytest.mark.parametrize("plan,overrides,needle", [
    (Plan(cp=3), {}, "--seq-len 32 does not divide by 6; valid --cp: 1, 2, 4, 8, 16"),
    (Plan(cp=4, tp=2, sp=True, cp_comm="all-gather"), {"seq_len": "40"},
     "2 x cp x tp (--sp) = 16 chunks (two per CP rank, for a balanced causal mask); --seq-len 40 does not divide"),
    (Plan(cp=2, cp_comm="p2p"), {}, "ring attention needs the fused attention kernel"),
    (Plan(cp=8, cp_comm="a2a"), {"seq_len": "64"}, "splits the 4 attention query groups over cp x tp = 8; "
                                                    "valid --cp: 1, 2, 4"),
    (Plan(cp=2, cp_comm="ring"), {}, "--cp-comm ring: valid values are p2p, all-gather, a2a"),
])
def test_bad_cp_plans_are_refused_in_one_line(host, plan, overrides, needle):
    with pytest.raises(UsageError) as err:
        plan_job(host, "toy", overrides, plan)
    assert needle in str(err.value) and "\n" not in str(err.value)
