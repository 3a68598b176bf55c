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
    compute = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == 1 and e["pid"] == 1]
    assert [(e["ts"], e["dur"]) for e in compute] == [(0, 3), (3, 1), (9, 1)]  # microseconds


def test_each_slice_is_named_by_its_kind_and_micro_batch():
    spans = timeline.read_log(LOG.splitlines(), {0})[0]
    doc = timeline.trace_events([("class 0", 0, spans)])
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # (Perfetto colours a slice by its name without digits: one colour per kind)
    assert [(e["name"], e["cat"]) for e in slices] == [
        ("forward 0", "forward"), ("all-reduce 0", "all-reduce"), ("forward 0", "forward"),
        ("receive 0", "receive"), ("compute", "compute")]
    assert slices[1]["args"] == {"rank": 0, "node": 1, "name": "mb0.fwd.x:all_reduce.tp", "micro_batch": 0}
    assert len({e["cname"] for e in slices}) == 4  # (chrome://tracing's colours, one per kind)


@pytest.mark.parametrize("name,kind,mb", [
    ("mb3.fwd.layers.0.attn.qkv", "forward", 3),
    ("mb12.chunk1.bwd.layers.7.mlp.fc1.bwd", "backward", 12),
    ("mb0.chunk0.w.bwd.layers.0.mlp.fc2.bwd.wgrad", "weight gradient", 0),  # a zero-bubble W
    ("mb5.chunk0.recompute.layers.0.attn.proj", "recompute", 5),
    ("optimizer.bucket0:adam", "optimizer", None),
    ("step2.mb1.fwd.layers.0.attn.qkv", "forward", 1),  # a decode step's
])
def test_what_a_compute_node_is_from_its_name(name, kind, mb):
    span = Span(0, name, timeline.COMPUTE, 0, 1)
    assert timeline.span_kind(span) == kind and timeline.micro_batch(name) == mb


def test_a_collectives_kind_and_args_come_from_the_trace():
    from stage_core.api import CollectiveType, NodeType, TraceNode

    def node(i, kind, **attrs):
        return TraceNode(id=i, name=f"n{i}", type=kind, attrs={k: ("int64_val", v) if isinstance(v, int) else
                                                             ("string_val", v) for k, v in attrs.items()})

    nodes = [node(0, NodeType.COMP, num_ops=2 * 64 * 64 * 64, tensor_size=3 * 64 * 64 * 2),
             node(1, NodeType.COMM_COLL, comm_type=int(CollectiveType.ALL_GATHER), comm_size=1000, pg_name="3"),
             node(2, NodeType.COMM_SEND, comm_size=512, comm_dst=9, comm_tag=7)]
    details = timeline.node_details(nodes, {"3": [0, 1, 2, 3]})
    assert details[0] == {"flops": 524_288, "bytes": 24_576}
    # an all-gather of a 1,000-byte shard on 4 ranks: 3,000 bytes on the rank's link
    assert details[1] == {"comm_type": "all_gather", "bytes": 1000, "group": "3", "group_ranks": 4,
                          "wire_bytes": 3000}
    assert details[2] == {"bytes": 512, "peer": 9, "tag": 7}
    span = Span(1, "grad_sync.bucket0:all_reduce.dp", timeline.COLL, 0, 5)  # (its name says all-reduce)
    doc = timeline.trace_events([("class 0", 0, [span])], {0: details})
    (event,) = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert event["name"] == "all-gather" and event["args"]["group_ranks"] == 4  # the trace's type wins


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


def test_a_log_cut_short_reads_what_is_whole():
    lines = LOG.splitlines()
    cut = lines[:6] + [lines[6][:70]]  # (a full disk: the last line stops half-way)
    spans = timeline.read_log(cut, {0})[0]
    assert [s.node for s in spans] == [0]  # node 2's callback line is cut: it never ended
