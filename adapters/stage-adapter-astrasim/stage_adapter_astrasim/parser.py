"""Read what the ASTRA-sim analytical binary printed: per-rank finish and statistics.

Lines it prints (spdlog; times in cycles, which are nanoseconds)::

    [..] [workload] [info] sys[4] finished, 138672922 cycles, exposed communication 41445621 cycles.
    [..] [statistics] [info] sys[4], Wall time: 138672922
    [..] [statistics] [info] sys[4], Comm time: 46888219
    [..] [statistics] [info] sys[4], GPU time: 97227301
    [..] [statistics] [info] sys[4], Total compute-communication overlap: 5442598
    [..] [statistics] [info] sys[4], Compute bound percentage: 97.655%
    ...

(astra-sim ``astra-sim/workload/Statistics.cc`` ``Statistics::report``; the order of the
time lines varies, and the overlap line is printed only when it is non-zero.)  A rank
with no ``finished`` line never finished: the simulator still exits 0.

Lines that say why ranks did not finish (:class:`Markers`): the analytical binaries
print ``[HardwareResource] [critical] !!!Hardware Resource sys.id=1 has unreleased
nodes!!!`` for each rank left holding nodes (a deadlock); htsim prints ``Warning:
Simulation timed out.`` when its run ends (at 4 s of simulated time) with ranks
unfinished, and ``Flow tcpsrc finished at 0.295668`` (ms) as each flow ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

_FINISHED = re.compile(
    r"sys\[(\d+)\] finished,\s*(\d+) cycles(?:,\s*exposed communication (\d+) cycles)?")
_UNRELEASED = re.compile(r"sys\.id=(\d+) has unreleased nodes")
_FLOW_END = re.compile(r"^Flow \S+ finished at ([0-9.eE+-]+)")
TIMED_OUT = "Warning: Simulation timed out."
_STAT = re.compile(r"sys\[(\d+)\],\s*([A-Za-z][A-Za-z \-]*?):\s*([-+0-9.eE]+)\s*(%?)\s*$")

# label printed -> key in results.json; times are ns, percentages 0-100
STAT_KEYS = {
    "Wall time": "wall_time_ns",
    "GPU time": "gpu_time_ns",
    "CPU time": "cpu_time_ns",
    "Comm time": "comm_time_ns",
    "Remote mem time": "remote_mem_time_ns",
    "Replay time": "replay_time_ns",
    "Invalid time": "invalid_time_ns",
    "Total compute-communication overlap": "compute_comm_overlap_ns",
    "Compute bound percentage": "compute_bound_pct",
    "Average compute utilization": "avg_compute_utilization_pct",
    "Average memory utilization": "avg_memory_utilization_pct",
    "Average operation intensity": "avg_operation_intensity",
}


@dataclass
class RankResult:
    """One rank: finish time and exposed communication (ns) plus its statistics."""

    rank: int
    finish_time_ns: int | None = None
    exposed_comm_ns: int | None = None
    stats: dict[str, float | int] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.finish_time_ns is not None


def _key(label: str) -> str:
    known = STAT_KEYS.get(label)
    if known:
        return known
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def _value(key: str, text: str, percent: bool) -> float | int:
    number = float(text)
    if key.endswith("_ns") and number.is_integer():
        return int(number)
    if key.endswith("_pct") and not percent:
        number *= 100.0  # some versions print a 0-1 fraction without "%"
    return number


@dataclass
class Markers:
    """What the output says about ranks that did not finish."""

    unreleased: set[int] = field(default_factory=set)  # ranks holding nodes at the end (a deadlock)
    timed_out: bool = False  # htsim's run ended at its time limit with ranks unfinished
    last_flow_ms: float | None = None  # when htsim's last flow ended, ms of simulated time


def parse_lines(lines: Iterable[str], markers: Markers | None = None) -> dict[int, RankResult]:
    """Per-rank results from the simulator's output lines, keyed by rank; ``markers``,
    when given, collects what :class:`Markers` holds."""
    ranks: dict[int, RankResult] = {}
    for line in lines:
        if "sys[" not in line:
            if markers is not None:
                _mark(line, markers)
            continue
        match = _FINISHED.search(line)
        if match:
            res = ranks.setdefault(int(match.group(1)), RankResult(int(match.group(1))))
            res.finish_time_ns = int(match.group(2))
            if match.group(3) is not None:
                res.exposed_comm_ns = int(match.group(3))
            continue
        match = _STAT.search(line)
        if match:
            rank = int(match.group(1))
            key = _key(match.group(2).strip())
            res = ranks.setdefault(rank, RankResult(rank))
            res.stats[key] = _value(key, match.group(3), bool(match.group(4)))
    return ranks


def _mark(line: str, markers: Markers) -> None:
    if line.startswith("Flow "):
        match = _FLOW_END.match(line)
        if match:
            markers.last_flow_ms = float(match.group(1))
    elif "unreleased nodes" in line:
        match = _UNRELEASED.search(line)
        if match:
            markers.unreleased.add(int(match.group(1)))
    elif TIMED_OUT in line:
        markers.timed_out = True


def parse_stdout(text: str) -> dict[int, RankResult]:
    """:func:`parse_lines` on a whole captured stdout."""
    return parse_lines(text.splitlines())


def unfinished_ranks(ranks: dict[int, RankResult], world_size: int) -> list[int]:
    """Ranks 0..world_size-1 with no ``finished`` line: deadlocked or never started."""
    return [r for r in range(world_size) if r not in ranks or not ranks[r].finished]
