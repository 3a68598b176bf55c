"""The per-node log: spans, the compute / exposed communication / bubble split, trace-event JSON."""

from __future__ import annotations

import json

import pytest

from stage_adapter_astrasim import timeline
from stage_adapter_astrasim.timeline import Span

# ASTRA-sim's workload lines (Workload::issue / Workload::call), rank 0 and rank 1
LOG = """\
[2026-12-02T17:03:42+00:00] [D] <workload>: issue,sys->id=0, tick=0, node->id=0, node->name=mb0.fwd.qkv, node->type=4
[2026-12-02T17:03:42+00:00] [D] <workload>: issue,sys->id=1, tick=0, node->id=0, node->name=mb0.fwd.qkv, node->type=4
[2026-12-02T17:03:42+00:00] [D] <workload>: operation_intensity=0.16, perf=5.5, elapsed_time=5.9e-08
[2026-12-02T17:03:42+00:00] [D] <workload>: callback,sys->id=0, tick=3000, node->id=0, node->name=mb0.fwd.qkv, node->type=4
[2026-12-02T17:03:42+00:00] [D] <workload>: issue,sys->id=0, tick=3000, node->id=1, node->name=mb0.fwd.x:all_reduce.tp, node->type=7
[2026-12-02T17:03:42+00:00] [D] <workload>: issue,sys->id=0, tick=3000, node->id=2, node->name=mb0.fwd.y, node->type=4
[2026-12-02T17:03:42+00:00] [D] <workload>: callback,sys->id=0, tick=4000, node->id=2, node->name=mb0.fwd.y, node->type=4
[2026-12-02T17:03:42+00:00] [D] <workload>: callback,sys->id=0, tick=6000, node->id=1, node->name=mb0.fwd.x:all_reduce.tp, node->type=7
[2026-12-02T17:03:42+00:00] [D] <workload>: issue,sys->id=0, tick=6000, node->id=3, node->name=mb0.bwd:recv:g, node->type=6
[2026-12-02T17:03:42+00:00] [D] <workload>: callback,sys->id=0, tick=9000, node->id=3, node->name=mb0.bwd:recv:g, node->type=6
[2026-12-02T17:03:42+00:00] [D] <workload>: issue,sys->id=0, tick=9000, node->id=4, node->name=name, with=comma, node->type=4
[2026-12-02T17:03:42+00:00] [D] <workload>: callback,sys->id=0, tick=10000, node->id=4, node->name=name, with=comma, node->type=4
"""


def test_spans_of_the_chosen_ranks():
    spans = timeline.read_log(LOG.splitlines(), {0})
    assert set(spans) == {0}
    assert spans[0] == [Span(0, "mb0.fwd.qkv", 4, 0, 3000), Span(1, "mb0.fwd.x:all_reduce.tp", 7, 3000, 6000),
                        Span(2, "mb0.fwd.y", 4, 3000, 4000), Span(3, "mb0.bwd:recv:g", 6, 6000, 9000),
                        Span(4, "name, with=comma", 4, 9000, 10000)]
    # rank 1's node never called back: left out
    assert timeline.read_log(LOG.splitlines(), {1}) == {1: []}


def test_compute_exposed_communication_and_bubble_by_hand():
    spans = timeline.read_log(LOG.splitlines(), {0})[0]
    # compute 0-3, 3-4, 9-10 us: 5 us; the all-reduce 3-6 runs alone 4-6: 2 us exposed;
    # waiting on the receive 6-9 and nothing after 10 until the finish at 12: 5 us of bubble
    assert timeline.breakdown(spans, 12000) == {"compute_ns": 5000, "exposed_comm_ns": 2000, "bubble_ns": 5000}


def check_trace_event_json(doc):
    """The trace-event format (Chrome's "Trace Event Format"; what Perfetto's UI opens):
    an object with a traceEvents list; complete events (ph X) with a name, a category,
    numeric pid/tid and ts/dur in microseconds; metadata events (ph M) naming processes
    and threads."""
    json.dumps(doc)  # plain JSON
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    names = {}
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
            assert ("name" in e["args"]) or ("sort_index" in e["args"])
            if e["name"] == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
        else:
            assert isinstance(e["name"], str) and isinstance(e["cat"], str)
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            assert (e["pid"], e["tid"]) in names  # every track is named
    return names


def test_trace_events_have_a_track_per_class_and_stream():
    spans = timeline.read_log(LOG.splitlines(), {0})[0]
    doc = timeline.trace_events([("class 0: ranks 0-7", 0, spans), ("class 1: ranks 8-15", 8, spans)])
    names = check_trace_event_json(doc)
    assert sorted(set(names.values())) == ["communication", "compute", "receives"]
    assert {pid for pid, _ in names} == {1, 2}
    compute = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute" and e["pid"] == 1]
    assert [(e["ts"], e["dur"]) for e in compute] == [(0, 3), (3, 1), (9, 1)]  # microseconds


def test_the_logging_configuration_names_the_file(tmp_path):
    text = timeline.logging_config(tmp_path / "t.log")
    assert f'filename = "{tmp_path / "t.log"}"' in text and 'name = "workload"' in text
    assert "basic_file_sink_st" in text  # not the rotating default sink


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is the adapter's optional plot extra")
    spans = timeline.read_log(LOG.splitlines(), {0})[0]
    out = tmp_path / "t.png"
    timeline.plot([("class 0", 0, spans)], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
