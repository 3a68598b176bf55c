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

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from stage_core.api import COMM_KEYS, hardware, netmodel, write_figure

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
        try:
            rank, pos = _field(line, "sys->id=", at)
            if int(rank) not in ranks:
                continue
            tick, pos = _field(line, "tick=", pos)
            node, pos = _field(line, "node->id=", pos)
            name_at = line.index("node->name=", pos) + len("node->name=")
            type_at = line.rindex(", node->type=")
            name, kind = line[name_at:type_at], int(line[type_at + len(", node->type="):].strip())
            int(tick), int(node)
        except ValueError:  # a line cut short (a full disk, a killed run): not a node's
            continue
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


#: what a span is, from its node's type and the name lowering gave it
#: (``mb<k>[.chunk<c>].fwd|bwd|recompute|w.bwd...``, ``optimizer...``, ``grad_sync...``,
#: ``...:all_reduce.<axes>``): its colour in the plot and its name in Perfetto
KIND_COLORS = {
    "forward": "#4c72b0", "backward": "#c44e52", "weight gradient": "#e4a0a2", "recompute": "#8172b3",
    "optimizer": "#937860", "compute": "#9e9e9e",
    "all-reduce": "#dd8452", "all-gather": "#ccb974", "reduce-scatter": "#da8bc3", "all-to-all": "#64b5cd",
    "send": "#55a868", "receive": "#8fd19e",
}
#: the legacy trace viewer's reserved colour per kind (chrome://tracing reads ``cname``;
#: Perfetto colours a slice by its name with the digits left out, so each kind has one)
_CNAMES = {"forward": "thread_state_runnable", "backward": "terrible", "weight gradient": "thread_state_unknown",
           "recompute": "detailed_memory_dump", "optimizer": "olive", "compute": "generic_work",
           "all-reduce": "thread_state_iowait", "all-gather": "yellow", "reduce-scatter": "rail_animation",
           "all-to-all": "background_memory_dump", "send": "good", "receive": "thread_state_running"}
#: the letter a plot's bar carries before its micro-batch
_LETTERS = {"forward": "F", "backward": "B", "weight gradient": "W", "recompute": "R"}
_MICRO_BATCH = re.compile(r"(?:^|\.)mb(\d+)(?:\.|:|$)")
_COLLECTIVE = re.compile(r":(all_reduce|all_gather|reduce_scatter|all_to_all)\.")
_PHASE = re.compile(r"(?:^|\.)(fwd|bwd|recompute|w)(?:\.|:)")


def micro_batch(name: str) -> int | None:
    """The micro-batch a node belongs to (``mb3...``), None for a step's own (the gradient
    sync, the optimizer)."""
    m = _MICRO_BATCH.search(name)
    return int(m[1]) if m else None


def span_kind(span: Span, attrs: Mapping | None = None) -> str:
    """``forward``, ``backward``, ``weight gradient`` (a zero-bubble W), ``recompute``,
    ``optimizer``, ``compute`` (anything else); ``all-reduce``, ``all-gather``,
    ``reduce-scatter``, ``all-to-all``; ``send``, ``receive``.  A collective's type is its
    node's ``comm_type`` when ``attrs`` gives it, else its name's."""
    if span.type == SEND:
        return "send"
    if span.type == RECV:
        return "receive"
    if span.type == COLL:
        kind = (attrs or {}).get("comm_type")
        if isinstance(kind, str):
            return kind.replace("_", "-")
        m = _COLLECTIVE.search(span.name)
        return m[1].replace("_", "-") if m else "all-reduce"
    if span.name.startswith("optimizer"):
        return "optimizer"
    m = _PHASE.search(span.name)
    if m is None:
        return "compute"
    return {"fwd": "forward", "bwd": "backward", "recompute": "recompute", "w": "weight gradient"}[m[1]]


def event_name(span: Span, attrs: Mapping | None = None) -> str:
    """A span's name in Perfetto: its kind and micro-batch (``backward 3``); Perfetto colours
    slices by name without digits, so every slice of a kind has one colour."""
    m = micro_batch(span.name)
    return span_kind(span, attrs) + ("" if m is None else f" {m}")


def node_details(nodes: Iterable, comm_groups: Mapping[str, Sequence[int]]) -> dict[int, dict]:
    """What a slice shows of its node, from the rank's trace (the core reader's nodes):
    a kernel's ``flops`` (num_ops as written) and ``bytes`` (tensor_size); a collective's
    ``comm_type``, ``bytes`` (its comm_size), ``wire_bytes`` (what the ring algorithm sends on
    the rank's link), ``group`` (pg_name) and ``group_ranks``; a send's or receive's
    ``bytes``, ``peer`` and ``tag``; every node's ``duration_us`` when the set is timed."""
    out: dict[int, dict] = {}
    for n in nodes:
        got: dict = {}
        if n.type == COMPUTE:
            got = {"flops": n.attr("num_ops"), "bytes": n.attr("tensor_size")}
        elif n.type == COLL:
            kind = COMM_KEYS.get(n.attr("comm_type"))
            group = n.attr("pg_name")
            size = n.attr("comm_size")
            ranks = len(comm_groups.get(str(group), ())) or None
            got = {"comm_type": kind, "bytes": size, "group": group, "group_ranks": ranks,
                   "wire_bytes": hardware.wire_bytes(kind, size, ranks) if kind and ranks and
                   isinstance(size, int) else None}
        elif n.type in (SEND, RECV):
            got = {"bytes": n.attr("comm_size"), "peer": n.attr("comm_dst" if n.type == SEND else "comm_src"),
                   "tag": n.attr("comm_tag")}
        if n.duration_micros:
            got["duration_us"] = n.duration_micros
        out[n.id] = got
    return out


def _args(rank: int, span: Span, attrs: Mapping | None) -> dict:
    """What a slice shows when clicked: the node, its micro-batch, and its costs and group
    from the rank's trace (``attrs``, when the caller read them)."""
    out = {"rank": rank, "node": span.node, "name": span.name}
    m = micro_batch(span.name)
    if m is not None:
        out["micro_batch"] = m
    out.update({k: v for k, v in (attrs or {}).items() if v is not None})
    return out


def trace_events(classes: Sequence[tuple[str, int, Sequence[Span]]],
                 details: Mapping[int, Mapping[int, Mapping]] | None = None) -> dict:
    """Chrome / Perfetto trace-event JSON: one process per rank class (``(label, rank,
    spans)``), one thread per stream; times in microseconds.  Each slice is named by its
    kind and micro-batch (:func:`event_name`), its category is its kind, and its args hold
    the node's name and id, its micro-batch and, from ``details`` ({rank: {node id:
    attributes}}: FLOPs, bytes, collective type, group and its ranks, peer), what the
    trace says of it."""
    events: list[dict] = []
    details = details or {}
    for pid, (label, rank, spans) in enumerate(classes, 1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for tid, stream in enumerate(STREAM_ORDER, 1):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
        tids = {stream: tid for tid, stream in enumerate(STREAM_ORDER, 1)}
        mine = details.get(rank, {})
        for s in spans:
            attrs = mine.get(s.node)
            kind = span_kind(s, attrs)
            events.append({"ph": "X", "name": event_name(s, attrs), "cat": kind, "cname": _CNAMES[kind],
                           "pid": pid, "tid": tids.get(s.stream, 4), "ts": s.start_ns / 1000,
                           "dur": (s.end_ns - s.start_ns) / 1000, "args": _args(rank, s, attrs)})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def plot(classes: Sequence[tuple[str, int, Sequence[Span]]], path: Path, title: str = "",
         details: Mapping[int, Mapping[int, Mapping]] | None = None, **rule) -> None:
    """The same timeline as a PNG (matplotlib, the adapter's ``plot`` extra), written by the
    core's output rule (``rule``: :func:`stage_core.api.write_output`'s ``inputs`` and ``force``).
    Each bar is coloured by its kind (:data:`KIND_COLORS`, the legend under the plot); a
    forward, backward, W or recompute bar wide enough carries its letter and micro-batch
    (``F3``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    details = details or {}
    rows = [(label, rank, stream, [s for s in spans if s.stream == stream])
            for label, rank, spans in classes for stream in STREAM_ORDER]
    rows = [r for r in rows if r[3] or r[2] != "receives"]  # (a rank that receives nothing: no row)
    end = max((s.end_ns for _, _, _, spans in rows for s in spans), default=1) / 1e6
    fig, ax = plt.subplots(figsize=(14, 0.42 * len(rows) + 2.0))
    used: dict[str, None] = {}
    for y, (label, rank, stream, spans) in enumerate(reversed(rows)):
        mine = details.get(rank, {})
        by_kind: dict[str, list] = {}
        for s in spans:
            kind = span_kind(s, mine.get(s.node))
            by_kind.setdefault(kind, []).append((s.start_ns / 1e6, max((s.end_ns - s.start_ns) / 1e6, 1e-4)))
            used[kind] = None
        for kind, bars in by_kind.items():
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=KIND_COLORS[kind], linewidth=0)
        if stream == "compute":
            _letters(ax, y, spans, mine, end)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{label}  {stream}" for label, _, stream, _ in reversed(rows)], fontsize=8)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("ms")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    order = [k for k in KIND_COLORS if k in used]
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in order], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(rows) > 6 else -0.25), ncol=min(len(order), 6), fontsize=8,
              frameon=False)
    fig.tight_layout()
    write_figure(path, fig, "--plot", **rule)


def _letters(ax, y: float, spans: Sequence[Span], attrs: Mapping[int, Mapping], end_ms: float) -> None:
    """``F3``, ``B3``...: one label per run of a micro-batch's bars of one kind, where the
    run is wide enough to hold it (about 1.2% of the step)."""
    runs: list[list] = []
    for s in spans:
        kind = span_kind(s, attrs.get(s.node))
        m = micro_batch(s.name)
        if kind not in _LETTERS or m is None:
            continue
        key = (kind, m)
        if runs and runs[-1][0] == key and s.start_ns / 1e6 - runs[-1][2] <= 0.01 * end_ms:
            runs[-1][2] = s.end_ns / 1e6
        else:
            runs.append([key, s.start_ns / 1e6, s.end_ns / 1e6])
    for (kind, m), a, b in runs:
        if b - a >= 0.012 * end_ms * (1 + len(str(m)) / 2):
            ax.text((a + b) / 2, y, f"{_LETTERS[kind]}{m}", ha="center", va="center", fontsize=6.5,
                    color="white", clip_on=True)


def class_label(index: int, ranks: Sequence[int], rank_ranges) -> str:
    return f"class {index}: ranks {rank_ranges(list(ranks))} (rank {ranks[0]} shown)"


def representatives(rank_classes: Sequence[Mapping]) -> list[int]:
    """The first rank of each rank class of a manifest."""
    return [rc["ranks"][0] for rc in rank_classes]
