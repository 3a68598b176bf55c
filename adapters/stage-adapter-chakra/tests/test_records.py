"""Reading a set decodes each distinct record once, and never hides a difference.

The reference everywhere is the plain way to decode a file: frame by frame with
``wire.iter_frames``, each record parsed by protobuf and converted, nothing shared.
``etread.read`` puts the StampDecoder (tests/test_stampread.py) in front of the
NodeDecoder; the tests that count the NodeDecoder's own steps take it away
(``node_decoder``).
"""

from __future__ import annotations

import json
import random

import pytest
from google.protobuf.message import DecodeError
from stage_core.api import CollectiveType, NodeType, ProgramNode, RankProgram, TraceJob, validate_trace_set as validate

from stage_adapter_chakra import ChakraReadError, et, etread, schema, wire
from stage_adapter_chakra.convert import trace_node
from stage_adapter_chakra.records import NodeDecoder

WORLD = 12


def reference(data: bytes) -> list:
    """The nodes of a file's bytes, decoded record by record with nothing shared."""
    frames = [bytes(rec) for _, rec in wire.iter_frames(data)]
    return [trace_node(schema.Node.FromString(rec)) for rec in frames[1:]]


def frames(path) -> list[bytes]:
    return [bytes(rec) for _, rec in wire.iter_frames(path.read_bytes())]


def write_frames(path, records: list[bytes]) -> None:
    path.write_bytes(b"".join(wire.frame(rec) for rec in records))


def edit_node(path, index: int, change) -> None:
    """Rewrite node ``index`` (0 = first node) of the file at ``path`` with ``change``."""
    records = frames(path)
    msg = schema.Node.FromString(records[index + 1])
    change(msg)
    records[index + 1] = msg.SerializeToString()
    write_frames(path, records)


def set_attr(name: str, **value):
    def change(msg):
        for attr in msg.attr:
            if attr.name == name:
                attr.ClearField("value")
                for kind, v in value.items():
                    setattr(attr, kind, v)
    return change


def _program(ranks, label: str, length: int) -> RankProgram:
    """Compute chains with a tp collective every 5th node, a dp one every 7th, and
    a send / receive pair: a class whose comm nodes differ from rank to rank."""
    nodes, prev = [], ()
    for i in range(length):
        if i == length - 1:
            node = ProgramNode(i, f"{label}.last", NodeType.COMP, prev, num_ops=7,
                               tensor_size=8)
        elif i % 7 == 6:
            node = ProgramNode(i, f"{label}.dp{i}", NodeType.COMM_COLL, prev,
                               comm_type=CollectiveType.ALL_REDUCE, comm_size=4096 + i,
                               group="dp")
        elif i % 5 == 4:
            node = ProgramNode(i, f"{label}.tp{i}", NodeType.COMM_COLL, prev,
                               comm_type=CollectiveType.ALL_GATHER, comm_size=512 + i,
                               group="tp")
        elif i == length // 2:
            node = ProgramNode(i, f"{label}.send", NodeType.COMM_SEND, prev, peer="next",
                               tag=3, comm_size=1 << 20)
        elif i == length // 2 + 1:
            node = ProgramNode(i, f"{label}.recv", NodeType.COMM_RECV, prev, peer="prev",
                               tag=3, comm_size=1 << 20)
        else:
            node = ProgramNode(i, f"{label}.op{i}", NodeType.COMP, prev,
                               num_ops=1000 * (i + 1), tensor_size=64 * (i + 1))
        nodes.append(node)
        prev = (i,)
    return RankProgram(tuple(ranks), tuple(nodes), label)


def group_name(rank: int, key: str) -> str:
    # tp groups of 3 ranks ("1".."4"), dp groups across them ("11".."13"); class A is
    # the even ranks, class B the odd ones, so the classes interleave in rank order
    return str(1 + rank // 3) if key == "tp" else str(11 + rank % 3)


def peer_rank(rank: int, key: str) -> int:
    return (rank + 2) % WORLD if key == "next" else (rank - 2) % WORLD


def big_job() -> TraceJob:
    groups = {str(1 + g): [r for r in range(WORLD) if r // 3 == g] for g in range(4)}
    groups.update({str(11 + d): [r for r in range(WORLD) if r % 3 == d] for d in range(3)})
    return TraceJob(programs=(_program(range(0, WORLD, 2), "A", 120),
                              _program(range(1, WORLD, 2), "B", 120)),
                    world_size=WORLD, comm_groups=groups, group_name=group_name,
                    peer_rank=peer_rank, name="interleaved")


@pytest.fixture
def node_decoder(monkeypatch):
    """``etread.read`` with the NodeDecoder alone."""
    monkeypatch.setattr(etread, "StampDecoder", NodeDecoder)


@pytest.fixture
def big_set(tmp_path):
    job = big_job()
    et.write(job, tmp_path)
    (tmp_path / "comm_groups.json").write_text(json.dumps(dict(job.comm_groups)))
    assert validate(etread.read(tmp_path)) == []
    return tmp_path


def check_against_reference(directory) -> dict[int, list]:
    got = dict(etread.read(directory).iter_ranks())
    for rank, nodes in got.items():
        assert nodes == reference((directory / f"trace.{rank}.et").read_bytes()), rank
    return got


# --------------------------------------------------------------------------- sharing


def test_set_reads_as_file_by_file_and_shares_equal_records(big_set):
    got = check_against_reference(big_set)
    a0, a2, b1 = got[0], got[2], got[1]
    # same class, other groups: compute nodes are the same objects, collectives
    # naming other groups are not
    assert all(x is y for x, y in zip(a0, a2) if x.type == NodeType.COMP)
    assert all(x is not y for x, y in zip(a0, a2)
               if x.type == NodeType.COMM_COLL and x.attr("pg_name") != y.attr("pg_name"))
    assert [x for x in a0 if x.type == NodeType.COMM_COLL] != [
        x for x in a2 if x.type == NodeType.COMM_COLL]
    assert len(b1) == len(a0) and not any(x == y for x, y in zip(a0, b1))


def test_one_template_per_class_then_runs_are_compared_not_split(big_set, monkeypatch,
                                                                node_decoder):
    calls = {"fresh": 0, "follow": 0}
    for name in calls:
        method = getattr(NodeDecoder, f"_{name}")

        def counted(self, *args, _name=name, _method=method):
            calls[_name] += 1
            return _method(self, *args)
        monkeypatch.setattr(NodeDecoder, f"_{name}", counted)
    check_against_reference(big_set)
    # classes A and B interleave; the first file of B is tried against A's template
    assert calls == {"fresh": 2, "follow": WORLD - 1}


def test_each_pass_over_the_set_has_its_own_decoder(big_set):
    ts = etread.read(big_set)
    first, second = dict(ts.iter_ranks()), dict(ts.iter_ranks())
    assert first == second
    assert all(x is not y for x, y in zip(first[0], second[0]))


@pytest.mark.parametrize("limit,templates", [(0, 1), (1, 1), (5, 2), (1 << 16, 4)])
def test_bounds_change_speed_not_results(big_set, limit, templates):
    decoder = NodeDecoder(limit=limit, templates=templates)
    for rank in range(WORLD):
        path = big_set / f"trace.{rank}.et"
        _, nodes = etread.read_et_file(path, decoder)
        assert nodes == reference(path.read_bytes())
    assert len(decoder._templates) <= templates


# --------------------------------------------------------------------------- differences


@pytest.mark.parametrize("index", [0, 1, 2, 57, 117, 119])
def test_one_changed_record_in_a_later_file_is_decoded(big_set, index):
    # 0 and 119 are the probes (the first and last record), 57 lies inside a run
    edit_node(big_set / "trace.8.et", index, set_attr("tensor_size", uint64_val=0))
    got = check_against_reference(big_set)
    changed = [(r, n.id) for r in range(0, WORLD, 2) for n, m in zip(got[r], got[0])
               if n.type == NodeType.COMP and n.attrs != m.attrs]
    assert changed == [(8, index)]


def test_same_length_change_inside_a_run(big_set):
    path = big_set / "trace.6.et"
    edit_node(path, 50, lambda msg: setattr(msg, "name", msg.name.replace("A.", "Z.")))
    got = check_against_reference(big_set)
    assert got[6][50].name == "Z.op50" and got[4][50].name == "A.op50"
    assert len(path.read_bytes()) == len((big_set / "trace.4.et").read_bytes())


def test_file_of_another_length_in_a_class(big_set):
    path = big_set / "trace.10.et"
    records = frames(path)
    write_frames(path, records[:60] + records[61:])  # a node left out
    check_against_reference(big_set)
    write_frames(path, records + records[-3:])  # three nodes more
    check_against_reference(big_set)


def test_compute_node_zero_on_one_rank_is_reported_for_that_rank(big_set):
    edit_node(big_set / "trace.4.et", 57, set_attr("tensor_size", uint64_val=0))
    problems = validate(etread.read(big_set))
    assert [(p.rank, p.node_id, p.reason) for p in problems] == [
        (4, 57, "tensor_size is 0, expected > 0")]


def test_bad_record_in_a_later_file_names_file_and_byte(big_set):
    list(etread.read(big_set).iter_ranks())  # the set is fine as written
    path = big_set / "trace.6.et"
    records = frames(path)
    offset = sum(len(wire.frame(rec)) for rec in records[:41])
    records[41] = b"\x0f" + records[41][1:]  # field 1 with wire type 7: not protobuf
    write_frames(path, records)
    with pytest.raises(ChakraReadError, match=rf"trace\.6\.et: record at byte {offset}:"):
        list(etread.read(big_set).iter_ranks())


def test_truncated_later_file(big_set):
    path = big_set / "trace.6.et"
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    with pytest.raises(ChakraReadError, match=r"trace\.6\.et: record at byte \d+: truncated"):
        list(etread.read(big_set).iter_ranks())


def test_random_damage_is_decoded_or_rejected_like_the_reference(big_set):
    rng = random.Random(7)
    originals = {r: (big_set / f"trace.{r}.et").read_bytes() for r in range(WORLD)}
    for trial in range(150):
        rank = rng.randrange(1, WORLD)
        data = bytearray(originals[rank])
        for _ in range(rng.choice([1, 1, 2, 5])):
            pos = rng.randrange(len(data))
            how = rng.random()
            if how < 0.6:
                data[pos] = rng.randrange(256)
            elif how < 0.8:
                del data[pos]
            else:
                data.insert(pos, rng.randrange(256))
        (big_set / f"trace.{rank}.et").write_bytes(bytes(data))
        try:
            want = reference(bytes(data))
        except (DecodeError, ValueError):
            want = None
        ts = etread.read(big_set)
        if want is None:
            with pytest.raises(ChakraReadError, match=rf"trace\.{rank}\.et"):
                list(ts.iter_ranks())
        else:
            assert dict(ts.iter_ranks())[rank] == want, trial
        (big_set / f"trace.{rank}.et").write_bytes(originals[rank])


# --------------------------------------------------------------------------- framing


def test_split_frames_matches_iter_frames():
    rng = random.Random(3)
    records = [bytes(rng.randrange(256) for _ in range(n))
               for n in [0, 1, 127, 128, 200, 16383, 16384, 70000]]
    data = b"".join(wire.frame(r) for r in records)
    got, starts = wire.split_frames(data)
    assert got == records == [bytes(r) for _, r in wire.iter_frames(data)]
    assert starts == [o for o, _ in wire.iter_frames(data)] + [len(data)]
    # a non-minimal length prefix (1 written in two and in three bytes)
    assert wire.split_frames(b"\x81\x00x\x81\x80\x00y") == ([b"x", b"y"], [0, 3, 7])
    for cut in range(1, len(data), 997):
        with pytest.raises(wire.FrameError):
            got, _ = wire.split_frames(data[:cut])
            if got != records[:len(got)] or len(got) == len(records):
                raise AssertionError(cut)  # a cut at a record boundary is no error
            raise wire.FrameError(0, "cut at a record boundary")


# --------------------------------------------------------------------------- pipelines
#
# A pipelined set: STAGES rank classes, one per pipeline stage.  A stage after the
# first starts with a receive from the previous stage, so the very first record of
# its files differs from rank to rank; tp groups change every TP ranks, dp groups
# every rank, and the embedding groups join the first and the last stage.

STAGES, TP, DP = 4, 3, 2
PER_STAGE = TP * DP


def _stage_program(ranks, stage: int, micro: int = 3, blocks: int = 6) -> RankProgram:
    label = f"s{stage}"
    nodes: list[ProgramNode] = []

    def add(name, node_type, **kw):
        prev = (len(nodes) - 1,) if nodes else ()
        nodes.append(ProgramNode(len(nodes), f"{label}.{name}", node_type, prev, **kw))

    for m in range(micro):
        if stage:
            add(f"mb{m}.recv", NodeType.COMM_RECV, peer="prev", tag=m, comm_size=1 << 16)
        for b in range(blocks):
            add(f"mb{m}.b{b}.op", NodeType.COMP, num_ops=1000 * (b + 1), tensor_size=64)
            add(f"mb{m}.b{b}.tp", NodeType.COMM_COLL, comm_type=CollectiveType.ALL_REDUCE,
                comm_size=4096 + b, group="tp")
            add(f"mb{m}.b{b}.act", NodeType.COMP, num_ops=77, tensor_size=32 + b)
        if stage < STAGES - 1:
            add(f"mb{m}.send", NodeType.COMM_SEND, peer="next", tag=m, comm_size=1 << 16)
    if stage in (0, STAGES - 1):
        add("emb", NodeType.COMM_COLL, comm_type=CollectiveType.ALL_REDUCE,
            comm_size=1 << 20, group="emb")
    add("grads", NodeType.COMM_COLL, comm_type=CollectiveType.REDUCE_SCATTER,
        comm_size=1 << 18, group="dp")
    add("optimizer", NodeType.COMP, num_ops=5, tensor_size=8)
    return RankProgram(tuple(ranks), tuple(nodes), label)


def pipe_job(order: str = "tp-dp-pp") -> TraceJob:
    """``order``: "tp-dp-pp" (tp fastest, a stage is a block of ranks) or "pp-tp-dp"
    (pp fastest: the stages interleave in rank order)."""
    world = STAGES * PER_STAGE

    def coords(rank):  # (stage, t, d)
        if order == "tp-dp-pp":
            return rank // PER_STAGE, rank % TP, rank // TP % DP
        return rank % STAGES, rank // STAGES % TP, rank // (STAGES * TP)

    def rank_of(stage, t, d):
        return next(r for r in range(world) if coords(r) == (stage, t, d))

    def group_name(rank, key):
        s, t, d = coords(rank)
        if key == "tp":
            return str(1 + s * DP + d)
        if key == "dp":
            return str(100 + s * TP + t)
        return str(200 + d * TP + t)  # emb

    groups: dict[str, list[int]] = {}
    for r in range(world):
        s = coords(r)[0]
        for key in ("tp", "dp") + (("emb",) if s in (0, STAGES - 1) else ()):
            groups.setdefault(group_name(r, key), []).append(r)

    def peer_rank(rank, key):
        s, t, d = coords(rank)
        return rank_of(s + 1 if key == "next" else s - 1, t, d)

    programs = tuple(_stage_program([r for r in range(world) if coords(r)[0] == s], s)
                     for s in range(STAGES))
    return TraceJob(programs=programs, world_size=world, comm_groups=groups,
                    group_name=group_name, peer_rank=peer_rank, name=f"pipe-{order}")


def write_pipe(directory, order: str = "tp-dp-pp"):
    job = pipe_job(order)
    et.write(job, directory)
    (directory / "comm_groups.json").write_text(json.dumps(dict(job.comm_groups)))
    return directory


@pytest.fixture
def pipe_set(tmp_path):
    directory = write_pipe(tmp_path)
    assert validate(etread.read(directory)) == []
    return directory


def count_calls(monkeypatch) -> dict:
    """Calls of NodeDecoder._fresh, and of _follow that took a file (not None)."""
    calls = {"fresh": 0, "follow": 0, "tried": 0}
    fresh, follow = NodeDecoder._fresh, NodeDecoder._follow

    def counted_fresh(self, *args):
        calls["fresh"] += 1
        return fresh(self, *args)

    def counted_follow(self, *args):
        calls["tried"] += 1
        got = follow(self, *args)
        calls["follow"] += got is not None
        return got
    monkeypatch.setattr(NodeDecoder, "_fresh", counted_fresh)
    monkeypatch.setattr(NodeDecoder, "_follow", counted_follow)
    return calls


def test_pipeline_stage_whose_first_record_differs_per_rank_has_one_template(
        pipe_set, monkeypatch, node_decoder):
    first = {r: reference((pipe_set / f"trace.{r}.et").read_bytes())[0]
             for r in range(PER_STAGE, 2 * PER_STAGE)}
    assert len({n.attr("comm_src") for n in first.values()}) == PER_STAGE
    calls = count_calls(monkeypatch)
    check_against_reference(pipe_set)
    assert (calls["fresh"], calls["follow"]) == (STAGES, STAGES * (PER_STAGE - 1))


def test_pipeline_stages_interleaved_in_rank_order(tmp_path, monkeypatch, node_decoder):
    directory = write_pipe(tmp_path, "pp-tp-dp")
    assert validate(etread.read(directory)) == []
    calls = count_calls(monkeypatch)
    got = check_against_reference(directory)
    assert (calls["fresh"], calls["follow"]) == (STAGES, STAGES * (PER_STAGE - 1))
    # nodes that do not depend on the rank are shared by the whole stage
    stage1 = [got[r] for r in range(1, len(got), STAGES)]
    for nodes in stage1[1:]:
        assert all(x is y for x, y in zip(nodes, stage1[0]) if x.type == NodeType.COMP)


def test_group_change_inside_a_stage_decodes_like_the_reference(pipe_set):
    got = check_against_reference(pipe_set)
    # ranks 6..8 and 9..11 are the two tp groups of stage 1: each group's
    # collectives are shared objects, the other group's are other nodes
    tp = [[n for n in got[r] if n.name.endswith(".tp")] for r in range(6, 12)]
    assert all(x is y for x, y in zip(tp[0], tp[2]))
    assert all(x is not y and x.attr("pg_name") != y.attr("pg_name")
               for x, y in zip(tp[2], tp[3]))
    assert all(x is y for x, y in zip(tp[3], tp[5]))


@pytest.mark.parametrize("rank", [8, 9, 10])  # the middle of stage 1; a group's first
@pytest.mark.parametrize("index", [0, 1, 2, 30, -1])  # recv, comp, tp, inside, last
def test_one_damaged_record_in_a_middle_stage_is_that_rank_only(pipe_set, rank, index):
    path = pipe_set / f"trace.{rank}.et"
    nodes = reference(path.read_bytes())
    index %= len(nodes)
    target = nodes[index]
    if target.type == NodeType.COMP:
        edit_node(path, index, set_attr("tensor_size", uint64_val=0))
        reason = "tensor_size is 0, expected > 0"
    else:
        edit_node(path, index, set_attr("is_cpu_op", bool_val=True))
        reason = "is_cpu_op is true, expected false on a comm node"
    check_against_reference(pipe_set)
    problems = validate(etread.read(pipe_set))
    assert [(p.rank, p.node_id, p.reason) for p in problems] == [
        (rank, target.id, reason)]


def test_renamed_node_in_a_middle_stage_makes_a_class_of_its_own(pipe_set, monkeypatch):
    edit_node(pipe_set / "trace.9.et", 20, lambda msg: setattr(msg, "name", "other"))
    calls = count_calls(monkeypatch)
    check_against_reference(pipe_set)
    assert calls["fresh"] == STAGES + 1
    problems = validate(etread.read(pipe_set))
    assert problems == []  # a name is free to differ; the file still reads right


@pytest.mark.parametrize("limit,templates,template_bytes",
                         [(0, 1, 1), (3, 2, 1 << 30), (1 << 16, 64, 1)])
def test_pipeline_bounds_change_speed_not_results(tmp_path, limit, templates,
                                                  template_bytes):
    directory = write_pipe(tmp_path, "pp-tp-dp")
    decoder = NodeDecoder(limit=limit, templates=templates, template_bytes=template_bytes)
    for rank in range(STAGES * PER_STAGE):
        path = directory / f"trace.{rank}.et"
        _, nodes = etread.read_et_file(path, decoder)
        assert nodes == reference(path.read_bytes()), rank
    assert 1 <= len(decoder._templates) <= templates


def test_random_damage_in_a_pipeline_is_decoded_or_rejected_like_the_reference(pipe_set):
    rng = random.Random(17)
    world = STAGES * PER_STAGE
    originals = {r: (pipe_set / f"trace.{r}.et").read_bytes() for r in range(world)}
    for trial in range(120):
        damaged = rng.sample(range(1, world), rng.choice([1, 1, 2]))
        for rank in damaged:
            data = bytearray(originals[rank])
            for _ in range(rng.choice([1, 1, 3])):
                pos = rng.randrange(len(data))
                how = rng.random()
                if how < 0.7:
                    data[pos] = rng.randrange(256)
                elif how < 0.85:
                    del data[pos]
                else:
                    data.insert(pos, rng.randrange(256))
            (pipe_set / f"trace.{rank}.et").write_bytes(bytes(data))
        want = {}
        for rank in range(world):
            data = (pipe_set / f"trace.{rank}.et").read_bytes()
            try:  # the header too, as the reader checks it
                header = schema.GlobalMetadata.FromString(next(wire.iter_frames(data))[1])
                want[rank] = reference(data) if header.version else None
            except (DecodeError, ValueError):
                want[rank] = None
        ts = etread.read(pipe_set)
        bad = [r for r in range(world) if want[r] is None]
        if bad:
            with pytest.raises(ChakraReadError, match=rf"trace\.{bad[0]}\.et"):
                list(ts.iter_ranks())
        else:
            assert dict(ts.iter_ranks()) == want, trial
        for rank in damaged:
            (pipe_set / f"trace.{rank}.et").write_bytes(originals[rank])


# --------------------------------------------------------------------------- derived
#
# A record that differs from the template's in one attribute entry is decoded from
# the template's node and that entry alone; anything else is decoded in full.

def _entry(body: bytes, two_byte_length: bool = False) -> bytes:
    if two_byte_length:
        return b"\x52" + bytes([0x80 | len(body), 0x00]) + body
    return b"\x52" + wire.varint(len(body)) + body


def _pg_body(value: bytes) -> bytes:
    """An AttributeProto body: name "pg_name", string_val ``value`` (raw bytes)."""
    return b"\x0a\x07pg_name\xea\x01" + wire.varint(len(value)) + value


ONE_ENTRY = [
    _entry(_pg_body(b"12345")),  # a longer value: the record changes length
    _entry(_pg_body(b"")),  # a shorter one
    _entry(_pg_body(b"7"), two_byte_length=True),  # a length written in two bytes
    _entry(b"\x0a\x09comm_size\x48\x05"),  # a repeated name: the first one counts
    _entry(b"\x0a\x07pg_name\x48\x05"),  # another kind
]
NOT_ONE_ENTRY = [
    b"\x50\x07",  # field 10 as a varint
    _entry(_pg_body(b"7")) + _entry(_pg_body(b"8")),  # two entries for one
    b"",  # the entry left out
]
NO_NODE = [
    _entry(b"\x0a\x07pg_name\xea\x01\x02\xff\xfe"),  # not UTF-8
    _entry(b"\x0a\x07pg_name\xea\x01\x05ab"),  # a value running past the entry
]


@pytest.mark.parametrize("new_entry", ONE_ENTRY + NOT_ONE_ENTRY + NO_NODE)
@pytest.mark.parametrize("rank", [7, 9])  # within a tp group, and a group's first rank
def test_record_with_another_attribute_entry(pipe_set, new_entry, rank, monkeypatch):
    path = pipe_set / f"trace.{rank}.et"
    records = frames(path)
    index = next(i for i, rec in enumerate(records) if b"pg_name" in rec)
    old = records[index]
    at = old.rindex(b"\x52", 0, old.index(b"pg_name"))  # the pg_name entry
    records[index] = old[:at] + new_entry + old[at + 2 + old[at + 1]:]
    write_frames(path, records)
    try:
        want = reference(path.read_bytes())
    except (DecodeError, ValueError):
        assert new_entry in NO_NODE
        with pytest.raises(ChakraReadError, match=rf"trace\.{rank}\.et: record at byte"):
            list(etread.read(pipe_set).iter_ranks())
        return
    decoded = []  # records parsed by protobuf as a whole
    parse = NodeDecoder._node

    def counted(self, record, offset):
        if record not in self._nodes:
            decoded.append(record)
        return parse(self, record, offset)
    monkeypatch.setattr(NodeDecoder, "_node", counted)
    got = dict(etread.read(pipe_set).iter_ranks())
    assert got[rank] == want
    assert (records[index] in decoded) == (new_entry in NOT_ONE_ENTRY)
    # the other ranks, and the other records of the rank, as written
    assert got == check_against_reference(pipe_set)


def test_records_of_16_kib_and_more_are_derived_too(tmp_path, monkeypatch):
    # a length prefix of three bytes; the name alone is 20,000 bytes
    nodes = (ProgramNode(0, "op", NodeType.COMP, (), num_ops=5, tensor_size=8),
             ProgramNode(1, "x" * 20_000, NodeType.COMM_COLL, (0,), group="tp",
                         comm_type=CollectiveType.ALL_REDUCE, comm_size=64),
             ProgramNode(2, "y" * 20_000, NodeType.COMP, (1,), num_ops=5, tensor_size=8))
    groups = {str(1 + g): [2 * g, 2 * g + 1] for g in range(3)}
    job = TraceJob(programs=(RankProgram(tuple(range(6)), nodes, "big"),), world_size=6,
                   comm_groups=groups, group_name=lambda rank, key: str(1 + rank // 2),
                   peer_rank=lambda rank, key: rank, name="long-records")
    et.write(job, tmp_path)
    (tmp_path / "comm_groups.json").write_text(json.dumps(groups))
    decoded = []
    parse = NodeDecoder._node

    def counted(self, record, offset):
        if record not in self._nodes:
            decoded.append(record)
        return parse(self, record, offset)
    monkeypatch.setattr(NodeDecoder, "_node", counted)
    got = check_against_reference(tmp_path)
    assert len(decoded) == 3  # rank 0's; the collectives of ranks 2 and 4 derived
    assert [got[r][1].attr("pg_name") for r in range(6)] == ["1", "1", "2", "2", "3", "3"]
    assert got[0][2] is got[5][2]
    assert validate(etread.read(tmp_path)) == []
