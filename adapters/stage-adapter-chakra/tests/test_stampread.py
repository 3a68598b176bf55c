"""The StampDecoder: a class's files read as its template plus a few substitutions.

The reference is test_records.reference: every record parsed by protobuf, nothing
shared.  Each test reads a set through ``etread.read`` and compares every file.
"""

from __future__ import annotations

import pytest
from stage_core.api import RANK_ATTRS, NodeType, StampedNodes, TraceNode

from stage_adapter_chakra import ChakraReadError, etread, schema
from stage_adapter_chakra.records import NodeDecoder
from stage_adapter_chakra.stampread import StampDecoder

from test_records import (STAGES, PER_STAGE, check_against_reference, edit_node, frames,  # noqa: F401
                          reference, set_attr, write_frames, write_pipe)


@pytest.fixture
def fallbacks(monkeypatch):
    """How many files the NodeDecoder decoded behind the StampDecoder."""
    calls = []
    decode = NodeDecoder.decode

    def counted(self, data, pos=0):
        calls.append(len(data))
        return decode(self, data, pos)

    monkeypatch.setattr(NodeDecoder, "decode", counted)
    return calls


@pytest.mark.parametrize("order", ["tp-dp-pp", "pp-tp-dp"])
def test_one_file_per_class_is_decoded_the_others_are_substitutions(tmp_path, fallbacks, order):
    directory = write_pipe(tmp_path, order)
    got = check_against_reference(directory)
    assert len(fallbacks) == STAGES  # the first file of each stage; classes interleave in pp-tp-dp
    # nodes without a rank-dependent attribute are the template's objects
    by_stage = {}
    for rank, nodes in sorted(got.items()):
        first = by_stage.setdefault(nodes[-1].name, nodes)
        assert all(x is y for x, y in zip(first, nodes) if x.type == NodeType.COMP)


def test_a_substitution_is_derived_once_and_shared(tmp_path):
    directory = write_pipe(tmp_path)
    decoder = StampDecoder()
    read = [etread.read_et_file(directory / f"trace.{r}.et", decoder)[1] for r in range(2 * PER_STAGE)]
    # ranks of one stage and one tp group share their tp collectives
    same = [(a, b) for a, b in zip(read[PER_STAGE], read[PER_STAGE + 1]) if a.name.endswith(".tp")]
    assert same and all(a is b and a.attr("pg_name") == b.attr("pg_name") for a, b in same)


def test_a_file_that_differs_elsewhere_is_decoded_in_full(tmp_path, fallbacks):
    directory = write_pipe(tmp_path)
    # one collective of a later file of stage 0 names another group than its siblings:
    # not one substitution per entry
    nodes = etread.read_et_file(directory / "trace.0.et")[1]
    tp = [i for i, n in enumerate(nodes) if n.name.endswith(".tp")]
    edit_node(directory / "trace.2.et", tp[1], set_attr("pg_name", string_val="77"))
    # and a compute node of another file has another size
    comp = next(i for i, n in enumerate(nodes) if n.type == NodeType.COMP)
    edit_node(directory / "trace.3.et", comp, set_attr("num_ops", int64_val=5))
    fallbacks.clear()
    got = check_against_reference(directory)
    assert len(fallbacks) == STAGES + 2
    assert got[2][tp[1]].attr("pg_name") == "77" and got[2][tp[0]].attr("pg_name") != "77"
    assert got[3][comp].attr("num_ops") == 5


def test_a_broken_entry_is_named_by_the_full_decode(tmp_path):
    directory = write_pipe(tmp_path)
    records = frames(directory / "trace.1.et")
    index = next(i for i, r in enumerate(records[1:], 1) if b"pg_name" in r)
    records[index] = records[index].replace(b"pg_name", b"pg_name\xff\xff", 1)
    write_frames(directory / "trace.1.et", records)
    with pytest.raises(ChakraReadError, match=r"trace\.1\.et: record at byte"):
        list(etread.read(directory).iter_ranks())


def test_entry_of_another_attribute_is_read_as_protobuf_would(tmp_path):
    # an entry replaced by one of another name and kind still decodes as the reference
    directory = write_pipe(tmp_path)
    nodes = etread.read_et_file(directory / "trace.0.et")[1]
    pos = [i for i, n in enumerate(nodes) if n.attr("pg_name") is not None]
    for i in pos:  # every occurrence of the entry, consistently
        if nodes[i].attr("pg_name") == nodes[pos[0]].attr("pg_name"):
            edit_node(directory / "trace.1.et", i, set_attr("pg_name", int64_val=3))
    check_against_reference(directory)


# --------------------------------------------------------------------------- several processes


def test_several_processes_read_what_one_reads(tmp_path, monkeypatch):
    from stage_adapter_chakra import parallelread

    directory = write_pipe(tmp_path)
    monkeypatch.setattr(etread, "MIN_FILES_PARALLEL", 1)
    monkeypatch.setattr(parallelread, "CHUNK", 5)
    one = dict(etread.read(directory, workers=1).iter_ranks())
    many = dict(etread.read(directory, workers=2).iter_ranks())
    assert one == many and len(many) == STAGES * PER_STAGE
    assert sum(type(nodes).__name__ == "StampedNodes" for nodes in many.values()) > STAGES
    check_against_reference(directory)


def _applied(stamped) -> list:
    """The nodes a StampedNodes stands for, from its base and values alone."""
    out = []
    for node in stamped.base:
        attrs = {name: (kind, stamped.values.get((name, value), value)) if name in RANK_ATTRS else (kind, value)
                 for name, (kind, value) in node.attrs.items()}
        out.append(TraceNode(node.id, node.name, node.type, node.data_deps, node.ctrl_deps, attrs,
                             node.duration_micros))
    return out


@pytest.mark.parametrize("order", ["tp-dp-pp", "pp-tp-dp"])
def test_several_processes_give_one_base_per_class(tmp_path, monkeypatch, order):
    # each worker reads a class's files against a template of its own; this process
    # reads a worker's template as the first one's with values replaced, and the
    # values of the files read from it are composed with those
    from stage_adapter_chakra import parallelread

    directory = write_pipe(tmp_path, order)
    monkeypatch.setattr(etread, "MIN_FILES_PARALLEL", 1)
    monkeypatch.setattr(parallelread, "CHUNK", 2)
    decoded = []
    monkeypatch.setattr(parallelread, "_nodes", lambda path: decoded.append(path) or [])
    got = dict(etread.read(directory, workers=3).iter_ranks())
    stamped = [nodes for nodes in got.values() if isinstance(nodes, StampedNodes)]
    assert len({id(nodes.base) for nodes in stamped}) == STAGES and not decoded
    assert len(stamped) == STAGES * (PER_STAGE - 1)
    for rank, nodes in got.items():
        expected = reference((directory / f"trace.{rank}.et").read_bytes())
        assert (_applied(nodes) if isinstance(nodes, StampedNodes) else nodes) == expected, rank


def test_composed_values_by_hand():
    from stage_adapter_chakra.parallelread import composed

    # a -> b: "1" became "2", "4" became "9", the rest stayed; b -> the file: "2" -> "3",
    # "9" -> "4" (so a's "4" is "4" again), peer 5 -> 6, and a "4" of b (none came from
    # a's "4") -> "1".  A "2" of a (if any) stayed "2" in b and is "3" in the file.
    first = {("pg_name", "1"): "2", ("pg_name", "4"): "9"}
    then = {("pg_name", "2"): "3", ("pg_name", "9"): "4", ("comm_dst", 5): 6, ("pg_name", "4"): "1"}
    assert composed(first, then) == {("pg_name", "1"): "3", ("pg_name", "2"): "3", ("pg_name", "9"): "4",
                                     ("comm_dst", 5): 6}


def test_several_processes_report_a_broken_file_as_one_does(tmp_path, monkeypatch):
    directory = write_pipe(tmp_path)
    monkeypatch.setattr(etread, "MIN_FILES_PARALLEL", 1)
    path = directory / f"trace.{PER_STAGE + 2}.et"
    path.write_bytes(path.read_bytes()[:-3])
    errors = []
    for workers in (1, 2):
        with pytest.raises(ChakraReadError) as caught:
            list(etread.read(directory, workers=workers).iter_ranks())
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and f"trace.{PER_STAGE + 2}.et" in errors[0]
