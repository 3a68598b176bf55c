"""results.json content and the text table, from parsed per-rank results."""

from __future__ import annotations

from typing import Any

from .parser import RankResult, unfinished_ranks

COLUMNS = (  # (header, getter of ns value)
    ("finish", lambda r: r.finish_time_ns),
    ("compute (GPU)", lambda r: r.stats.get("gpu_time_ns")),
    ("comm", lambda r: r.stats.get("comm_time_ns")),
    ("exposed comm", lambda r: r.exposed_comm_ns),
)


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 8, 10, 11]`` -> ``"0-3,8,10-11"``."""
    parts: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def build_results(ranks: dict[int, RankResult], world_size: int,
                  meta: dict[str, Any], outcome=None) -> dict[str, Any]:
    """The results.json object: per-rank numbers in ns and a summary.

    ``outcome`` (:class:`.outcome.Outcome`): why the run ended.  ``deadlock`` and
    ``deadlocked_ranks`` name a deadlock only; ``unfinished_ranks`` are the ranks with no
    ``finished`` line whatever the cause (``outcome``, ``message``).  Without an outcome
    every unfinished rank counts as deadlocked.
    """
    stuck = unfinished_ranks(ranks, world_size)
    status = outcome.status if outcome is not None else ("deadlock" if stuck else "finished")
    finished = [r for r in ranks.values() if r.finished and r.rank < world_size]
    extra = sorted(r for r in ranks if r >= world_size)
    rows = []
    for rank in sorted(r for r in ranks if r < world_size):
        res = ranks[rank]
        rows.append({"rank": rank, "finished": res.finished,
                     "finish_time_ns": res.finish_time_ns,
                     "exposed_comm_ns": res.exposed_comm_ns, **res.stats})
    summary = {
        "world_size": world_size,
        "finished_ranks": len(finished),
        "max_finish_time_ns": max((r.finish_time_ns for r in finished), default=None),
        "outcome": status,
        "unfinished_ranks": stuck,
        "deadlock": status == "deadlock",
        "deadlocked_ranks": stuck if status == "deadlock" else [],
    }
    if outcome is not None and outcome.message:
        summary["message"] = outcome.message
    if extra:
        summary["ranks_outside_world"] = extra
    return {"units": {"time": "ns", "percentages": "0-100"}, **meta,
            "summary": summary, "ranks": rows}


def _ms(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.3f}"


def format_table(ranks: dict[int, RankResult], world_size: int) -> str:
    """Ranks with identical numbers collapsed into one row; times in ms."""
    groups: dict[tuple, list[int]] = {}
    for rank in sorted(r for r, res in ranks.items() if res.finished and r < world_size):
        values = tuple(get(ranks[rank]) for _, get in COLUMNS)
        groups.setdefault(values, []).append(rank)
    header = ["ranks"] + [f"{name} ms" for name, _ in COLUMNS]
    body = [[rank_ranges(rs)] + [_ms(v) for v in values]
            for values, rs in sorted(groups.items(), key=lambda kv: kv[1][0])]
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i])
                       for i, cell in enumerate(row)) for row in [header] + body]
    return "\n".join(lines)


def format_summary(results: dict[str, Any]) -> str:
    """The lines under the table: step time and, if any, the deadlock."""
    s = results["summary"]
    lines = []
    if s["max_finish_time_ns"] is not None:
        lines.append(f"step time (max finish): {_ms(s['max_finish_time_ns'])} ms "
                     f"({s['finished_ranks']} of {s['world_size']} ranks finished)")
    if s["deadlock"]:
        lines.append(f"DEADLOCK: ranks {rank_ranges(s['deadlocked_ranks'])} never "
                     f"finished ({len(s['deadlocked_ranks'])} of {s['world_size']})")
    if s.get("ranks_outside_world"):
        lines.append(f"warning: output names ranks {rank_ranges(s['ranks_outside_world'])}"
                     f" outside world_size {s['world_size']}")
    return "\n".join(lines)
