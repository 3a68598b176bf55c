"""DualPipe's placement, "dual" (DeepSeek-V3 report §3.2.1): two copies of a model cut into pp
chunks, stage i holding chunk i for the micro-batches fed from the first stage and chunk
pp - 1 - i for those fed from the last.  Here with a third party's plain two-way order (the
forwards of each direction, then the backwards), on the core's toy model: where chunks sit,
what the host refuses, the order's step by hand, and what lowering makes of it against 1F1B
(both copies' parameters on each stage, messages each way, the gradients summed over the pair)."""

from __future__ import annotations

import pytest

from stage_core.api import (Plan, ScheduleSpec, hookimpl, main, order_problem, plan_job, read_trace_set,
                            simulate_order, write_trace_set)
from stage_core.checks import checked_order
from stage_core.guard import Owner, PluginFault
from stage_core.schedule.steps import chunk_of, copies, stage_of
from stage_core.testing import fresh_host, jsonl_plugin, reference_strategies, toy_plugin
from stage_core.trace import NodeType
from stage_core.validate import examine


def two_way(stages, micro_batches, chunks=2):
    """The first half of the micro-batches fed from the first stage (copy 0), the rest from the
    last (copy 1): every stage runs the first half's forwards, the second half's, then the
    second half's backwards and the first half's."""
    half = micro_batches // 2
    fwd, rev = range(half), range(half, micro_batches)
    steps = ([("F", m, 0) for m in fwd] + [("F", m, 1) for m in rev] + [("B", m, 1) for m in rev]
             + [("B", m, 0) for m in fwd])
    return [list(steps) for _ in range(stages)]


class TwoWay:
    def __init__(self, order=two_way, chunks=2):
        self.order, self.chunks = order, chunks

    @hookimpl
    def stage_schedules(self):
        return [ScheduleSpec("two-way", self.order, "both directions, GPipe-like", chunks=self.chunks,
                             placement="dual")]


def host_with(plugin=None):
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"),
                      (plugin or TwoWay(), "two-way-plugin"))


def test_where_the_chunks_sit():
    # pp 4: stage 1 holds chunk 1 (copy 0) and chunk 2 (copy 1); chunk 2 runs on stage 2 forward, stage 1 reverse
    assert [chunk_of("dual", 1, local, 4) for local in (0, 1)] == [1, 2]
    assert [chunk_of("dual", 3, local, 4) for local in (0, 1)] == [3, 0]
    assert [stage_of("dual", 2, 4, copy) for copy in (0, 1)] == [2, 1]
    assert [copies(p) for p in ("loop", "v", "dual")] == [1, 1, 2]
    assert [stage_of("v", 5, 4, copy) for copy in (0, 1)] == [2, 2]  # the copy means nothing elsewhere


@pytest.mark.parametrize("change,expected", [
    (lambda o: o[1].insert(0, ("F", 0, 1)),
     "stage 1: micro-batch 0 runs both copies (chunks 0 and 1); under placement 'dual' a micro-batch runs the copy "
     "of its direction, chunk 0 (fed from the first stage) or 1 (fed from the last), on every stage"),
    (lambda o: o[1].__setitem__(slice(None), [(k, m, 1 - c) if m == 0 else (k, m, c) for k, m, c in o[1]]),
     "stage 1: micro-batch 0 runs chunk 1, but chunk 0 on stage 0: under placement 'dual' a micro-batch keeps its "
     "direction (copy) through the pipeline"),
    (lambda o: o[0].remove(("B", 3, 1)), "stage 0: micro-batch 3, chunk 1 has no B step"),
    (lambda o: o[0].append(("F", 0, 2)), "stage 0, step 8 ('F', 0, 2): chunk 2 is not in 0..1"),
])
def test_order_problem_under_dual(change, expected):
    order = two_way(2, 4)
    assert order_problem(order, 2, 4, 2, "dual") is None
    change(order)
    assert order_problem(order, 2, 4, 2, "dual") == expected


def test_the_two_way_step_by_hand():
    # pp 2, micro-batch 0 forward (copy 0), 1 reverse (copy 1); F 1, a whole backward 2 (B 1 + W 1):
    # stage 0: F0 [0,1]; stage 1: F0 [1,2] (after stage 0's), F1 [2,3] (its first chunk);
    # stage 0: F1 [3,4] (after stage 1's), B1 [4,6] (the last chunk of micro-batch 1);
    # stage 1: B1 [6,8] (after stage 0's), B0 [8,10]; stage 0: B0 [10,12].
    # Idle: stage 0 12 - 0 - 6 busy = 6, stage 1 10 - 1 - 6 = 3.
    assert simulate_order(two_way(2, 2), 2, 1, 1, 1, "dual") == (12, [6, 3])


def test_a_dual_order_that_switches_copy_is_refused_naming_the_plugin(capsys, tmp_path):
    def switching(stages, micro_batches, chunks=2):
        order = two_way(stages, micro_batches)
        order[1] = [(k, m, 1 - c) if m == 0 else (k, m, c) for k, m, c in order[1]]
        return order

    host = host_with(TwoWay(switching))
    out = tmp_path / "out"
    status = main(["generate", "--model", "toy", "--format", "jsonl", "--pp", "2", "--micro-batches", "4",
                   "--schedule", "two-way", "-o", str(out)], host=host)
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(lines) == 1 and not out.exists()
    assert lines[0] == ("stage: error: plugin 'two-way-plugin': schedule 'two-way': its order for pp 2, 4 "
                        "micro-batches, 2 chunks a stage (placement 'dual'): stage 1: micro-batch 0 runs chunk 1, "
                        "but chunk 0 on stage 0: under placement 'dual' a micro-batch keeps its direction (copy) "
                        "through the pipeline")


def test_a_dual_schedule_of_other_than_two_chunks_is_the_plugins_fault():
    spec = ScheduleSpec("two-way", two_way, chunks=1, placement="dual")
    with pytest.raises(PluginFault, match=r"chunks 1 with placement 'dual': a stage runs 2 chunks, the two copies"):
        checked_order(spec, Owner("two-way-plugin", kind="schedule", name="two-way"))


@pytest.mark.parametrize("flags,expected", [
    (["--virtual-stages", "2"], "stage: error: --virtual-stages 2: --schedule two-way cuts the model into pp chunks "
                                "and runs two copies of them (one per direction); leave --virtual-stages out"),
    (["--task", "prefill"], "stage: error: --schedule two-way: its two copies of the model are for training "
                            "(micro-batches fed from both ends); --task prefill runs --schedule 1f1b or another "
                            "one-copy schedule"),
])
def test_what_a_dual_schedule_does_not_take_is_one_line(capsys, flags, expected):
    status = main(["report", "--model", "toy", "--set", "layers=4", "--pp", "2", "--micro-batches", "4",
                   "--schedule", "two-way", *flags], host=host_with())
    assert (status, capsys.readouterr().err.strip()) == (2, expected)


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """The toy of 4 layers on pp 4, 4 micro-batches (dp 1 and dp 2), two-way and 1F1B; the two-way sets written."""
    host = host_with()
    out = {}
    for dp in (1, 2):
        for schedule in ("two-way", "1f1b"):
            result = plan_job(host, "toy", {"layers": "4"}, Plan(pp=4, dp=dp, micro_batches=4, schedule=schedule))
            target = None
            if schedule == "two-way":
                target = write_trace_set(host, result, tmp_path_factory.mktemp("dual") / f"dp{dp}", "jsonl")
            out[(schedule, dp)] = (result, target)
    return host, out


def memory(result, key):
    return [rc["memory_bytes"][key] for rc in result.manifest["rank_classes"]]


def test_each_stage_holds_both_copies(lowered):
    _, runs = lowered
    dual, base = runs[("two-way", 1)][0], runs[("1f1b", 1)][0]
    table = 128 * 64 * 2  # the tied embedding (V x h, bf16 as its gradient): one table serves both copies there
    for key in ("parameters", "gradients"):
        a, b = memory(dual, key), memory(base, key)
        assert a[1:3] == [b[1] + b[2]] * 2 == [2 * b[1]] * 2  # the middle stages: two layer chunks, twice 1F1B's
        assert a[0] == a[3] == b[0] + b[3] - table
    opt_a, opt_b = memory(dual, "optimizer"), memory(base, "optimizer")
    assert opt_a[1] == 2 * opt_b[1] and opt_a[0] == opt_b[0] + opt_b[3] - 128 * 64 * 12  # fp32 master, m, v


def test_activations_of_both_directions_in_flight(lowered):
    # every forward before any backward: a stage keeps 4 micro-batches of a layer chunk, two of each copy, where
    # 1F1B's stage 1 keeps p - 1 = 3 of its chunk
    _, runs = lowered
    dual, base = runs[("two-way", 1)][0], runs[("1f1b", 1)][0]
    assert memory(dual, "activations")[1] * 3 == memory(base, "activations")[1] * 4


def sends(result, stage):
    """(micro-batch, peer) of every pipeline send of ``stage``'s program."""
    return {(int(n.name.split(".")[0][2:]), n.peer) for n in result.job.programs[stage].nodes
            if n.type == NodeType.COMM_SEND}


def test_each_direction_sends_its_own_way(lowered):
    _, runs = lowered
    dual = runs[("two-way", 1)][0]
    # stage 1: micro-batches 0, 1 (forward) send activations down to stage 2 and gradients up to stage 0; 2, 3
    # (reverse) activations to stage 0 and gradients to stage 2
    assert sends(dual, 1) == {(m, peer) for m in range(4) for peer in ("pp+1", "pp-1")}
    assert sends(dual, 0) == {(0, "pp+1"), (1, "pp+1"), (2, "pp+1"), (3, "pp+1")}  # both end here or start here
    names = [n.name for n in dual.job.programs[0].nodes if n.type == NodeType.COMM_SEND]
    assert sum(".fwd:" in n for n in names) == 2 and sum(".bwd:" in n for n in names) == 2


def pair_sum_bytes(result, stage):
    return [n.comm_size for n in result.job.programs[stage].nodes
            if n.type == NodeType.COMM_COLL and n.group and ":all_reduce.pp@" in n.name]


def test_the_copies_gradients_are_summed_over_the_pair(lowered):
    _, runs = lowered
    for dp in (1, 2):
        dual = runs[("two-way", dp)][0]
        for stage, pair in ((0, "pp@0,3"), (1, "pp@1,2"), (2, "pp@1,2"), (3, "pp@0,3")):
            nodes = [n for n in dual.job.programs[stage].nodes if n.type == NodeType.COMM_COLL]
            assert {n.name.rsplit(".", 1)[-1] for n in nodes if ":all_reduce.pp" in n.name} == {pair.split(".")[-1]}
            # after the dp all-reduce (dp 2) the whole gradient is summed over the pair: every gradient byte once
            assert sum(pair_sum_bytes(dual, stage)) == memory(dual, "gradients")[stage]
            if dp > 1:  # each bucket's pair sum reads its dp all-reduce
                by_id = {n.id: n for n in nodes}
                assert all(any(":all_reduce.dp" in by_id[d].name for d in n.data_deps if d in by_id)
                           for n in nodes if ":all_reduce.pp@" in n.name)
        assert "grad_sync.shared" not in {n.name.split(":")[0] for p in dual.job.programs for n in p.nodes}


def test_the_sets_finish_in_the_replay(lowered):
    host, runs = lowered
    for dp in (1, 2):
        report = examine(read_trace_set(host, runs[("two-way", dp)][1]))
        assert report.problems == [] and report.verdict.finishes
