"""Reading a set decodes each distinct record once, and never hides a difference.

The reference everywhere is the plain way to decode a file: frame by frame with
``wire.iter_frames``, each record parsed by protobuf and converted, nothing shared.
"""

from __future__ import annotations

import json
import random

import pytest
from google.protobuf.message import DecodeError
from stage_core.trace import CollectiveType, NodeType, ProgramNode, RankProgram, TraceJob
from stage_core.validate import validate

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


def test_one_template_per_class_then_runs_are_compared_not_split(big_set, monkeypatch):
    calls = {"fresh": 0, "follow": 0}
    for name in calls:
        method = getattr(NodeDecoder, f"_{name}")

        def counted(self, *args, _name=name, _method=method):
            calls[_name] += 1
            return _method(self, *args)
        monkeypatch.setattr(NodeDecoder, f"_{name}", counted)
    check_against_reference(big_set)
    assert calls == {"fresh": 2, "follow": WORLD - 2}  # classes A and B interleave


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
