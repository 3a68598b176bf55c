"""The simulated step node by node, from the simulator's own log.

With ``"trace-enabled": 1`` in system.json, ASTRA-sim's workload layer logs, at debug
level, when it issues each node and when the node's callback fires (astra-sim
``Workload::issue`` and ``Workload::call``)::

    [..] [D] <workload>: issue,sys->id=4, tick=1200, node->id=7, node->name=mb0.fwd.qkv, node->type=4
    [..] [D] <workload>: callback,sys->id=4, tick=5200, node->id=7, node->name=mb0.fwd.qkv, node->type=4

(ticks are ns).  The default log sink rotates at 10 MB and keeps 10 files, so the
adapter passes ``--logging-configuration`` with a plain file sink for the workload
logger (:func:`logging_config`).  Every rank logs; one rank per rank class is read.

Streams: ``compute`` (compute nodes: one at a time), ``communication`` (sends and
collectives: the one slot) and ``receives``.  Per rank: *compute* is the time a
kernel runs, *exposed communication* the time a send or collective is in flight
while no kernel runs, *bubble* the rest of the step (waiting on a receive, or on
nothing issuable).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from stage_core.api import netmodel, write_figure

LOG_FILE = "timeline.log"
LOGGING_FILE = "logging.toml"

COMPUTE, SEND, RECV, COLL = 4, 5, 6, 7
STREAMS = {COMPUTE: "compute", COLL: "communication", SEND: "communication", RECV: "receives"}
STREAM_ORDER = ("compute", "communication", "receives")
#: bytes the log takes per node of every rank (an issue and a callback line)
LOG_BYTES_PER_NODE = 300


def logging_config(log: Path) -> str:
    """spdlog_setup TOML: the workload logger's debug lines into ``log``, never rotated."""
    return ('[[sink]]\nname = "stage_timeline"\ntype = "basic_file_sink_st"\n'
            f'filename = "{log}"\nlevel = "debug"\ntruncate = true\n\n'
            '[[logger]]\nname = "workload"\nsinks = ["stage_timeline"]\nlevel = "debug"\n')


@dataclass(frozen=True, slots=True)
class Span:
    node: int
    name: str
    type: int
    start_ns: int
    end_ns: int

    @property
    def stream(self) -> str:
        return STREAMS.get(self.type, "other")


def _field(line: str, key: str, start: int = 0) -> tuple[str, int]:
    i = line.index(key, start) + len(key)
    j = line.find(", ", i)
    return line[i:j], j


def read_log(lines: Iterable[str], ranks: set[int]) -> dict[int, list[Span]]:
    """Spans of ``ranks``' nodes, in issue order; nodes never called back are left out."""
    started: dict[tuple[int, int], tuple[int, str, int]] = {}
    spans: dict[int, list[Span]] = {r: [] for r in ranks}
    for line in lines:
        at = line.find("sys->id=")
        if at < 0:
            continue
        rank, pos = _field(line, "sys->id=", at)
        if int(rank) not in ranks:
            continue
        tick, pos = _field(line, "tick=", pos)
        node, pos = _field(line, "node->id=", pos)
        name_at = line.index("node->name=", pos) + len("node->name=")
        type_at = line.rindex(", node->type=")
        name, kind = line[name_at:type_at], int(line[type_at + len(", node->type="):].strip())
        key = (int(rank), int(node))
        if line[at - 6:at] == "issue,":
            started[key] = (int(tick), name, kind)
        elif key in started:
            begin, name, kind = started.pop(key)
            spans[key[0]].append(Span(key[1], name, kind, begin, int(tick)))
    for r in spans:
        spans[r].sort(key=lambda s: (s.start_ns, s.node))
    return spans


def breakdown(spans: Sequence[Span], finish_ns: int) -> dict[str, int]:
    """compute, exposed communication and bubble (ns) of one rank; they add up to ``finish_ns``
    (:func:`stage_core.netmodel.step_breakdown`, as ``stage estimate`` breaks its replay down)."""
    compute, exposed, bubble = netmodel.step_breakdown(
        ((s.start_ns, s.end_ns) for s in spans if s.type == COMPUTE),
        ((s.start_ns, s.end_ns) for s in spans if s.type in (SEND, COLL)), finish_ns)
    return {"compute_ns": compute, "exposed_comm_ns": exposed, "bubble_ns": bubble}


def trace_events(classes: Sequence[tuple[str, int, Sequence[Span]]]) -> dict:
    """Chrome / Perfetto trace-event JSON: one process per rank class (``(label, rank,
    spans)``), one thread per stream; times in microseconds."""
    events: list[dict] = []
    for pid, (label, rank, spans) in enumerate(classes, 1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for tid, stream in enumerate(STREAM_ORDER, 1):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
        tids = {stream: tid for tid, stream in enumerate(STREAM_ORDER, 1)}
        for s in spans:
            events.append({"ph": "X", "name": s.name, "cat": s.stream, "pid": pid, "tid": tids.get(s.stream, 4),
                           "ts": s.start_ns / 1000, "dur": (s.end_ns - s.start_ns) / 1000,
                           "args": {"rank": rank, "node": s.node}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def plot(classes: Sequence[tuple[str, int, Sequence[Span]]], path: Path, title: str = "", **rule) -> None:
    """The same timeline as a PNG (matplotlib, the adapter's ``plot`` extra), written by the
    core's output rule (``rule``: :func:`stage_core.api.write_output`'s ``inputs`` and ``force``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"compute": "#4c72b0", "communication": "#dd8452", "receives": "#55a868"}
    rows = [(label, stream, [s for s in spans if s.stream == stream])
            for label, _, spans in classes for stream in STREAM_ORDER]
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(rows) + 1.2))
    for y, (label, stream, spans) in enumerate(reversed(rows)):
        bars = [(s.start_ns / 1e6, max((s.end_ns - s.start_ns) / 1e6, 1e-4)) for s in spans]
        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colors[stream], linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{label} {stream}" for label, stream, _ in reversed(rows)], fontsize=8)
    ax.set_xlabel("ms")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    write_figure(path, fig, "--plot", **rule)


def class_label(index: int, ranks: Sequence[int], rank_ranges) -> str:
    return f"class {index}: ranks {rank_ranges(list(ranks))} (rank {ranks[0]} shown)"


def representatives(rank_classes: Sequence[Mapping]) -> list[int]:
    """The first rank of each rank class of a manifest."""
    return [rc["ranks"][0] for rc in rank_classes]
