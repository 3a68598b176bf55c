"""Pipeline parallel against REFERENCE §2 and §3: send/recv volumes per stage boundary,
the activations a schedule keeps in flight, the tied embedding's gradient sum."""

import pytest

from stage_core.api import NodeType, Plan, gpipe, interleaved_1f1b, one_f_one_b, plan_job

S, H, A = 32, 64, 4  # the toy's sequence, hidden size and heads


def by_stage(result):
    return {min(rc["ranks"]): rc for rc in result.manifest["rank_classes"]}


def p2p(nodes, kind):
    return [n for n in nodes if n.type == kind]


@pytest.mark.parametrize("sp", [False, True])
def test_one_send_and_one_recv_per_boundary_per_micro_batch_each_way(traces, sp):
    p, m, t = 4, 6, 2
    result, ts, ranks = traces(Plan(pp=p, tp=t, sp=sp, micro_batches=m), overrides={"layers": "8"})
    size = S * 1 * H * 2 // (t if sp else 1)  # s*b*h*2 bytes, divided by t with SP
    for rank, nodes in ranks.items():
        stage = rank // t
        sends, recvs = p2p(nodes, NodeType.COMM_SEND), p2p(nodes, NodeType.COMM_RECV)
        expect = (stage < p - 1) * m + (stage > 0) * m  # activations forward, gradients backward
        assert len(sends) == len(recvs) == expect
        assert {n.attr("comm_size") for n in sends + recvs} == ({size} if expect else set())
        for n in sends:  # forward to the next stage, gradients to the previous one
            dst = n.attr("comm_dst")
            assert dst == rank + t if ".fwd:" in n.name else dst == rank - t


@pytest.mark.parametrize("sp", [False, True])
def test_scatter_gather_sends_a_tp_slice_and_gathers_it_on_arrival(traces, sp):
    """Megatron's scatter/gather (Narayanan et al. 2021, section 4.1): each of the t tensor-parallel
    ranks sends s*b*h*2/t bytes, and the receiver all-gathers the t slices over its tp group; with
    SP the activation is already sharded over tp, so nothing changes."""
    p, m, t = 3, 4, 2
    plan = Plan(pp=p, tp=t, sp=sp, micro_batches=m, options=(("pp-scatter-gather", True),))
    result, ts, ranks = traces(plan, overrides={"layers": "6"})
    size = S * 1 * H * 2 // t
    for rank, nodes in ranks.items():
        stage = rank // t
        sends, recvs = p2p(nodes, NodeType.COMM_SEND), p2p(nodes, NodeType.COMM_RECV)
        assert len(sends) == len(recvs) == (stage < p - 1) * m + (stage > 0) * m
        assert {n.attr("comm_size") for n in sends + recvs} == {size}
        gathers = [n for n in nodes if ":gather:" in n.name]
        assert len(gathers) == (0 if sp else len(recvs))
        for g, r in zip(gathers, recvs):  # each received slice gathered over the tp group, right after it
            assert g.attr("comm_size") == size and r.id in g.data_deps
            assert ts.comm_groups[g.attr("pg_name")] == [stage * t + i for i in range(t)]
    assert result.manifest["plan"]["options"] == {"pp-scatter-gather": True}


def test_1f1b_first_stage_holds_p_micro_batches_of_its_layers(host):
    """1F1B: stage 0 keeps p micro-batches in flight, i.e. the activations of all L layers."""
    p, L, m = 4, 8, 8
    result = plan_job(host, "toy", {"layers": str(L)}, Plan(pp=p, micro_batches=m))
    layer = S * H * (34 + 5 * A * S // H)  # Korthikanti, no parallelism, b = 1
    embedding_mask = S * H  # the embedding dropout's 1-byte mask, kept on stage 0
    stages = by_stage(result)
    assert stages[0]["memory_bytes"]["activations"] == L * layer + p * embedding_mask
    # the last stage holds one micro-batch: its layers plus the head's softmax and final norm
    assert stages[3 * 1]["memory_bytes"]["activations"] < stages[0]["memory_bytes"]["activations"]


def test_gpipe_holds_every_micro_batch(host):
    p, L, m = 2, 4, 6
    result = plan_job(host, "toy", {"layers": str(L)}, Plan(pp=p, micro_batches=m, schedule="gpipe"))
    layer = S * H * (34 + 5 * A * S // H)
    assert by_stage(result)[0]["memory_bytes"]["activations"] == m * (L // p * layer + S * H)


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 3)])
def test_interleaving_multiplies_first_stage_memory_by_1_plus_p_minus_1_over_pv(host, p, v):
    L, m = p * v * 2, 4 * p
    result = plan_job(host, "toy", {"layers": str(L)},
                      Plan(pp=p, virtual_stages=v, schedule="interleaved", micro_batches=m))
    layer = S * H * (34 + 5 * A * S // H)
    # count, from the schedule alone, the chunks stage 0 holds after each step
    live = chunk0 = 0
    points = []
    for kind, _, chunk in interleaved_1f1b(p, m, v)[0]:
        step = 1 if kind == "F" else -1
        live += step
        chunk0 += step if chunk == 0 else 0
        points.append((live, chunk0))
    assert max(n for n, _ in points) / (p * v) == pytest.approx(1 + (p - 1) / (p * v))  # REFERENCE §2
    # chunk 0 also keeps the embedding dropout's mask
    expected = max(n * (L // (p * v)) * layer + c0 * S * H for n, c0 in points)
    assert by_stage(result)[0]["memory_bytes"]["activations"] == expected


def test_tied_embedding_gradients_are_summed_over_first_and_last_stage(traces):
    p, t = 3, 2
    result, ts, ranks = traces(Plan(pp=p, tp=t, micro_batches=3), overrides={"layers": "3"})
    vocab, hidden = 128, 64
    for rank, nodes in ranks.items():
        stage = rank // t
        shared = [n for n in nodes if n.type == NodeType.COMM_COLL and "grad_sync.shared" in n.name]
        if stage in (0, p - 1):
            assert len(shared) == 1
            assert shared[0].attr("comm_size") == vocab // t * hidden * 2  # vocab-parallel bf16 shard
            members = ts.comm_groups[shared[0].attr("pg_name")]
            assert members == sorted([rank % t, (p - 1) * t + rank % t])
        else:
            assert not shared


def test_schedules_order_steps_as_published():
    assert one_f_one_b(4, 8)[0][:5] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 3, 0), ("B", 0, 0)]
    assert gpipe(2, 3)[1] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("B", 0, 0), ("B", 1, 0), ("B", 2, 0)]


@pytest.mark.parametrize("plan,needle", [
    (Plan(pp=3), "valid --pp: 1, 2"),
    (Plan(pp=2, virtual_stages=2), "--schedule interleaved"),
    (Plan(pp=2, virtual_stages=2, schedule="interleaved", micro_batches=3), "multiple of --pp 2"),
    # no --pp splits 3 layers into 2 chunks each: the fix is --virtual-stages ("valid --pp: " was empty)
    (Plan(pp=3, virtual_stages=2, schedule="interleaved", micro_batches=3),
     "the 3 layers must split into 6 equal chunks; --virtual-stages must divide 3; valid: 1, 3"),
])
def test_bad_pipeline_plans_are_refused(host, plan, needle):
    from stage_core.api import UsageError

    layers = "3" if plan.pp == 3 and plan.virtual_stages == 2 else "2" if plan.virtual_stages == 1 else "4"
    with pytest.raises(UsageError, match=needle.replace("(", r"\(")):
        plan_job(host, "toy", {"layers": layers}, plan)
