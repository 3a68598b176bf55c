"""The stdout parser against the real ASTRA-sim sample run (8 ranks, dp2 tp2 pp2)."""

from __future__ import annotations

import re

from stage_adapter_astrasim.parser import parse_stdout, unfinished_ranks
from stage_adapter_astrasim.report import build_results, format_table, rank_ranges


def test_finish_times_of_the_sample(sample_stdout):
    ranks = parse_stdout(sample_stdout)
    assert sorted(ranks) == list(range(8))
    for r in range(4):
        assert ranks[r].finish_time_ns == 207_616_180
        assert ranks[r].exposed_comm_ns == 110_469_007
    for r in range(4, 8):
        assert ranks[r].finish_time_ns == 138_672_922
        assert ranks[r].exposed_comm_ns == 41_445_621
    assert unfinished_ranks(ranks, 8) == []


def test_statistics_of_rank_4(sample_stdout):
    stats = parse_stdout(sample_stdout)[4].stats
    assert stats == {
        "wall_time_ns": 138_672_922,
        "comm_time_ns": 46_888_219,
        "gpu_time_ns": 97_227_301,
        "compute_comm_overlap_ns": 5_442_598,
        "compute_bound_pct": 97.655,
        "avg_compute_utilization_pct": 97.675,
        "avg_memory_utilization_pct": 4.420,
        "avg_operation_intensity": 17650.927,
    }
    assert isinstance(stats["wall_time_ns"], int)


def test_statistics_order_does_not_matter(sample_stdout):
    # rank 0 prints GPU time before Comm time
    stats = parse_stdout(sample_stdout)[0].stats
    assert stats["gpu_time_ns"] == 97_147_173
    assert stats["comm_time_ns"] == 145_279_346
    assert stats["compute_comm_overlap_ns"] == 34_810_339


def test_truncated_stdout_reports_exactly_the_missing_ranks(sample_stdout):
    cut = "\n".join(line for line in sample_stdout.splitlines()
                    if not re.search(r"sys\[(2|5)\] finished", line))
    ranks = parse_stdout(cut)
    assert unfinished_ranks(ranks, 8) == [2, 5]
    results = build_results(ranks, 8, {})
    assert results["summary"]["deadlock"] is True
    assert results["summary"]["deadlocked_ranks"] == [2, 5]
    assert results["summary"]["finished_ranks"] == 6
    assert results["summary"]["max_finish_time_ns"] == 207_616_180


def test_ranks_that_print_nothing_are_deadlocked(sample_stdout):
    ranks = parse_stdout(sample_stdout)
    assert unfinished_ranks(ranks, 10) == [8, 9]


def test_fraction_statistics_become_percentages():
    line = "[x] [statistics] [info] sys[0], Compute bound percentage: 0.976550"
    assert parse_stdout(line)[0].stats["compute_bound_pct"] == 97.655


def test_results_summary(sample_stdout):
    results = build_results(parse_stdout(sample_stdout), 8, {"system": "preset h100"})
    assert results["system"] == "preset h100"
    assert results["summary"] == {"world_size": 8, "finished_ranks": 8,
                                  "max_finish_time_ns": 207_616_180, "outcome": "finished",
                                  "unfinished_ranks": [], "deadlock": False, "deadlocked_ranks": []}
    row4 = results["ranks"][4]
    assert row4["rank"] == 4 and row4["finished"] is True
    assert row4["finish_time_ns"] == 138_672_922
    assert row4["gpu_time_ns"] == 97_227_301


def test_table_collapses_identical_ranks(sample_stdout):
    table = format_table(parse_stdout(sample_stdout), 8).splitlines()
    assert len(table) == 3  # header + two groups
    assert table[1].split()[:2] == ["0-3", "207.616"]
    assert table[2].split() == ["4-7", "138.673", "97.227", "46.888", "41.446"]


def test_rank_ranges():
    assert rank_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert rank_ranges([5]) == "5"
    assert rank_ranges([]) == ""


def test_markers_of_a_deadlock_and_of_htsims_time_limit():
    """The lines ASTRA-sim prints when ranks do not finish (copied from runs of the binaries
    in the team's shared folder: a 4-rank set whose rank 0 skips the all-reduce)."""
    from stage_adapter_astrasim.parser import Markers, parse_lines

    analytical = ["[2026-12-03 10:16:06.907] [HardwareResource] [critical] !!!Hardware Resource sys.id=1 has "
                  "unreleased nodes!!!", "[2026-12-03 10:16:06.907] [HardwareResource] [critical] GPU comm node id: 0"]
    marks = Markers()
    parse_lines(analytical, marks)
    assert marks.unreleased == {1} and not marks.timed_out
    htsim = ["Flow tcpsrc finished at 0.003769", "Flow tcpsrc finished at 0.00754101",
             ".......Warning: Simulation timed out."]
    marks = Markers()
    parse_lines(htsim, marks)
    assert marks.timed_out and marks.last_flow_ms == 0.00754101 and not marks.unreleased


def test_htsims_time_limit_is_the_limit_for_a_validated_set_and_either_otherwise():
    """htsim reports a deadlock as it reports a step past its end (timed out at 4 s): a set
    that passed validation (whose replay finds every deadlock) is past the limit."""
    from stage_adapter_astrasim.outcome import classify
    from stage_adapter_astrasim.parser import Markers

    marks = Markers(timed_out=True, last_flow_ms=3000.5)
    got = classify(0, [2, 3], 4, marks, backend="htsim", validated=True, stops_at_ns=4 * 10**9)
    assert (got.status, got.unfinished) == ("time_limit", (2, 3))
    assert got.message == ("htsim stopped at its limit of 4 s of simulated time with ranks 2-3 unfinished (2 of 4); "
                           "its last message ended at 3,000.500 ms: the step takes longer than htsim can simulate; "
                           "use --backend analytical")
    got = classify(0, [2, 3], 4, marks, backend="htsim", validated=False, stops_at_ns=4 * 10**9)
    assert got.message.endswith("either the step takes longer, or these ranks wait forever (htsim reports a deadlock "
                                "only this way); `stage validate DIR` tells which")
    # a nonzero status is a failure whatever the markers say
    assert classify(134, [2, 3], 4, marks, backend="htsim", validated=True, stops_at_ns=4 * 10**9).status == "failed"
