"""DualPipe's order (bidirectional, placement "dual"): rank 0's and rank 3's steps by hand for
pp 4 and 8 micro-batches, the refusals, the bubble against the DeepSeek-V3 report's table
(Table 2: DualPipe (PP/2 - 1)(F&B + B - 3W), parameters 2x, activations PP + 1) replayed with
simulate_order, and parameters and activations on the kit's toy against 1F1B's."""

from __future__ import annotations

import pytest
from stage_core.api import NodeType, Plan, UsageError, main, order_problem, plan_job, simulate_order
from stage_core.testing import fresh_host, jsonl_plugin, reference_strategies, toy_plugin

from stage_schedule_dualpipe import dualpipe, dualpipe_v, plugin

HOST = fresh_host((plugin, "dualpipe"), (toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"))


def test_rank_0_of_pp4_by_hand():
    # pp 4, 8 micro-batches: 0-3 fed from rank 0 (chunk 0), 4-7 from rank 3 (chunk 1).  Rank 0 runs the phases of
    # DualPipeV's stage 0 of 2 stages with 4 micro-batches, its chunk 0 the forward direction: 2(2-0-1) = 2
    # forwards; 1 x (forward, reverse forward); 1 x (reverse B split, its W, reverse forward); 4-4+0+1 = 1 x the
    # two overlapped pairs; 1 x (B, pair); 1 x (B reverse whole, B forward split); 1 x (W, B split); the last W
    assert dualpipe(4, 8)[0] == [
        ("F", 0, 0), ("F", 1, 0),
        ("F", 2, 0), ("F", 4, 1),
        ("B", 4, 1), ("W", 4, 1), ("F", 5, 1),
        (("F", 3, 0), ("B", 5, 1)), (("F", 6, 1), ("B", 0, 0)),
        ("B", 6, 1), (("F", 7, 1), ("B", 1, 0)),
        ("B", 7, 1), ("B", 2, 0),
        ("W", 2, 0), ("B", 3, 0),
        ("W", 3, 0)]


def test_rank_3_is_rank_0_with_the_directions_swapped():
    # the reference's phase ^ is_in_second_half: rank 3 runs rank 0's steps, chunk 0 <-> 1, micro-batch m <-> m +- 4
    assert dualpipe(4, 8)[3][:4] == [("F", 4, 1), ("F", 5, 1), ("F", 6, 1), ("F", 0, 0)]
    for p, n in ((4, 8), (6, 12), (8, 20)):
        order = dualpipe(p, n)

        def mirrored(step):
            if isinstance(step[0], tuple):
                return tuple(mirrored(s) for s in step)
            kind, m, c = step
            return (kind, (m + n // 2) % n, 1 - c)

        for r in range(p):
            assert order[p - 1 - r] == [mirrored(s) for s in order[r]]


@pytest.mark.parametrize("p,n", [(2, 4), (4, 8), (4, 10), (6, 12), (8, 16), (8, 32)])
def test_orders_are_well_formed_and_each_direction_keeps_its_copy(p, n):
    order = dualpipe(p, n)
    assert order_problem(order, p, n, 2, "dual") is None
    for steps in order:  # micro-batches 0..n/2-1 run copy 0 (fed from rank 0), the rest copy 1 (fed from the last)
        flat = [s for step in steps for s in (step if isinstance(step[0], tuple) else (step,))]
        assert {(m, c) for _, m, c in flat} == {(m, int(m >= n // 2)) for m in range(n)}


@pytest.mark.parametrize("p,n", [(4, 8), (4, 12), (6, 12), (8, 16), (8, 24)])
@pytest.mark.parametrize("t", [1, 2.5])
def test_bubble_is_the_reports_with_equal_times(p, n, t):
    # DeepSeek-V3 report, Table 2, DualPipe: (PP/2 - 1)(F&B + B - 3W), PP = p ranks, B a whole backward. With F = B
    # (input) = W = t and a pair's parts one after the other (the replay gives no credit for overlap): F&B = 3t,
    # B = 2t, so (p/2 - 1) 2t; the step is that plus a rank's work, n chunks of 3t
    step, idle = simulate_order(dualpipe(p, n), p, t, t, t, "dual")
    assert step - n * 3 * t == (p // 2 - 1) * (3 * t + 2 * t - 3 * t)
    assert max(idle) == (p // 2 - 1) * 2 * t  # the ranks at the ends wait the whole bubble
    assert idle == [idle[p - 1 - r] for r in range(p)]


@pytest.mark.parametrize("p,n", [(4, 8), (8, 16), (8, 20)])
@pytest.mark.parametrize("times", [(1, 2, 1), (2, 3, 1), (3, 2, 2)])
def test_any_times_replay_as_dualpipev_of_half_the_ranks(p, n, times):
    # the DualPipe README's "cut-in-half": with other F, B, W the table's formula is the report's approximation, but
    # the replay is exactly DualPipeV's on p/2 stages and n/2 micro-batches, rank r idle as stage min(r, p-1-r)
    step, idle = simulate_order(dualpipe(p, n), p, *times, "dual")
    step_v, idle_v = simulate_order(dualpipe_v(p // 2, n // 2), p // 2, *times, "v")
    assert step == step_v and idle == [idle_v[min(r, p - 1 - r)] for r in range(p)]


@pytest.mark.parametrize("p,n,message", [
    (3, 6, "--pp 3: DualPipe needs an even pp (rank i and rank pp - 1 - i hold the same two chunks, so no rank "
           "may be its own mirror); give --pp 4, or --schedule dualpipev"),
    (4, 6, "--micro-batches 6: DualPipe needs an even count of at least 2 x pp = 8 (half fed from each end, each "
           "half filling the pipeline); give --micro-batches 8"),
    (4, 9, "--micro-batches 9: DualPipe needs an even count of at least 2 x pp = 8 (half fed from each end, each "
           "half filling the pipeline); give --micro-batches 10"),
])
def test_refusals_are_one_line_exit_2(capsys, tmp_path, p, n, message):
    with pytest.raises(UsageError, match=r"DualPipe needs an even"):
        dualpipe(p, n)
    out = tmp_path / "out"
    status = main(["generate", "--model", "toy", "--set", "layers=12", "--format", "jsonl", "--pp", str(p),
                   "--micro-batches", str(n), "--schedule", "dualpipe", "-o", str(out)], host=HOST)
    assert (status, capsys.readouterr().err.strip().splitlines()) == (2, [f"stage: error: {message}"])
    assert not out.exists()


@pytest.fixture(scope="module")
def toy():
    """The toy of 8 layers on pp 4, 8 micro-batches: DualPipe and 1F1B."""
    return {s: plan_job(HOST, "toy", {"layers": "8"}, Plan(pp=4, micro_batches=8, schedule=s))
            for s in ("dualpipe", "1f1b")}


def memory(result, key):
    return [rc["memory_bytes"][key] for rc in result.manifest["rank_classes"]]


def test_parameters_twice_1f1b(toy):
    # Table 2: parameters 2x.  A middle rank holds chunks 1 and 2, 1F1B's stages 1 and 2 (equal layers): twice
    # 1F1B's; rank 0 (and 3) chunks 0 and 3, 1F1B's stages 0 + 3 less the tied table they share (128 x 64 bf16)
    dual, base = memory(toy["dualpipe"], "parameters"), memory(toy["1f1b"], "parameters")
    assert dual[1] == dual[2] == 2 * base[1] == 2 * base[2] == 2 * 199_936
    assert dual[0] == dual[3] == base[0] + base[3] - 128 * 64 * 2 == 416_512


def test_activation_peak_is_pp_plus_1_micro_batches(toy):
    # Table 2: activations PP + 1.  1F1B's stage s holds p - s micro-batches of its chunk: a chunk's activations of
    # one micro-batch are 1F1B's stage-1 peak / 3 (chunks 1 and 2 alike: 2 layers each), chunk 0's stage 0's / 4,
    # chunk 3's stage 3's.  DualPipe's rank 1 by hand: F0, F4, F1, F5, F2 before its first backward hold 5 micro-
    # batches of a 2-layer chunk.  Rank 0: F0 F1 F2 (chunk 0) and F4 (chunk 3), B4 frees one and F5 takes it back,
    # then the pair (F3, B5) holds 4 of chunk 0 and 1 of chunk 3, its forward counted before its backward frees
    dual, base = memory(toy["dualpipe"], "activations"), memory(toy["1f1b"], "activations")
    assert base[1] % 3 == 0 and base[1] // 3 == base[2] // 2 == 180_224
    assert dual[1] == dual[2] == (4 + 1) * base[1] // 3 == 901_120
    assert dual[0] == dual[3] == 4 * base[0] // 4 + 1 * base[3] == 925_696


def test_pipeline_bytes_by_hand(toy):
    # every message is one micro-batch's hidden state, seq 32 x h 64 x 2 B = 4,096 B.  Rank 0: for micro-batches
    # 0-3 it sends the activation and receives the gradient, for 4-7 (chunk 3, the reverse direction's last) it
    # receives the activation and sends the gradient: 16 messages, as 1F1B's stage 0 (8 sends, 8 receives); a
    # middle rank 32, both ways for every micro-batch.  The job's pipeline bytes are 1F1B's
    def pipeline_bytes(result):
        return [sum(n.comm_size for n in p.nodes if n.type in (NodeType.COMM_SEND, NodeType.COMM_RECV))
                for p in result.job.programs]

    assert pipeline_bytes(toy["dualpipe"]) == [16 * 4096, 32 * 4096, 32 * 4096, 16 * 4096]
    assert pipeline_bytes(toy["dualpipe"]) == pipeline_bytes(toy["1f1b"])
    # and the pair sum of the two copies' gradients: every gradient byte of the rank once (1F1B: only the tied table)
    sums = [sum(n.comm_size for n in p.nodes if n.type == NodeType.COMM_COLL and ":all_reduce.pp@" in n.name)
            for p in toy["dualpipe"].job.programs]
    assert sums == memory(toy["dualpipe"], "gradients") == [416_512, 399_872, 399_872, 416_512]
