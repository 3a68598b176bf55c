"""The chakra backend: round trip, attribute contract, determinism, byte identity."""

from __future__ import annotations

import json
import os

import pytest
from stage_core import __version__ as stage_version
from stage_core.api import NodeType, ProgramNode, RankProgram, TraceJob

from stage_adapter_chakra import ChakraReadError, ChakraWriteError, et, etread, schema, wire

# REFERENCE.md §6, written out independently of the package's own table:
# attribute -> oneof member ASTRA-sim reads it from
CONTRACT = {
    NodeType.COMP: {"is_cpu_op": "bool_val", "num_ops": "int64_val",
                    "tensor_size": "uint64_val"},
    NodeType.COMM_COLL: {"is_cpu_op": "bool_val", "comm_type": "int64_val",
                         "comm_size": "int64_val", "pg_name": "string_val"},
    NodeType.COMM_SEND: {"is_cpu_op": "bool_val", "comm_dst": "int32_val",
                         "comm_tag": "int32_val", "comm_size": "int64_val"},
    NodeType.COMM_RECV: {"is_cpu_op": "bool_val", "comm_src": "int32_val",
                         "comm_tag": "int32_val", "comm_size": "int64_val"},
}


def _program_of(job, rank):
    return next(p for p in job.programs if rank in p.ranks)


def expected_attrs(job, rank, node: ProgramNode) -> dict:
    """What each attribute must decode to on ``rank``: (kind, value in its unit)."""
    values = {"is_cpu_op": False}
    if node.type == NodeType.COMP:
        values.update(num_ops=node.num_ops, tensor_size=node.tensor_size)
    elif node.type == NodeType.COMM_COLL:
        values.update(comm_type=int(node.comm_type), comm_size=node.comm_size)
        if node.group is not None:
            values["pg_name"] = job.group_name(rank, node.group)
    else:
        peer = "comm_dst" if node.type == NodeType.COMM_SEND else "comm_src"
        values.update({peer: job.peer_rank(rank, node.peer), "comm_tag": node.tag,
                       "comm_size": node.comm_size})
    kinds = CONTRACT[node.type]
    return {name: (kinds[name], value) for name, value in values.items()}


def test_round_trip_attribute_by_attribute(job, tmp_path):
    et.write(job, tmp_path)
    ts = etread.read(tmp_path)
    assert ts.world_size == 4 and ts.metadata["version"] == "0.0.4"
    assert ts.metadata["format"] == "chakra-et-0.0.4"
    seen = 0
    for rank, nodes in ts.iter_ranks():
        program = _program_of(job, rank)
        assert [n.id for n in nodes] == [p.id for p in program.nodes]
        for got, want in zip(nodes, program.nodes):
            assert (got.name, got.type) == (want.name, int(want.type))
            assert got.data_deps == list(want.data_deps)
            assert got.ctrl_deps == list(want.ctrl_deps)
            assert got.duration_micros == want.duration_micros
            assert got.attrs == expected_attrs(job, rank, want), (rank, want.name)
            seen += 1
    assert seen == sum(len(p.nodes) * len(p.ranks) for p in job.programs)


def test_units_and_rank_dependent_values(job, tmp_path):
    et.write(job, tmp_path)
    _, r0 = etread.read_et_file(tmp_path / "trace.0.et")
    _, r3 = etread.read_et_file(tmp_path / "trace.3.et")
    fwd = r0[0]
    assert fwd.attrs["num_ops"] == ("int64_val", 3 * (1 << 40) + 12345)  # FLOPs as given
    assert fwd.attrs["tensor_size"] == ("uint64_val", 6 << 30)  # bytes as given
    assert r0[5].attrs["comm_size"] == ("int64_val", 3 << 30)
    assert r0[5].attrs["pg_name"] == ("string_val", "1")  # dp group of rank 0
    assert r3[5].attrs["pg_name"] == ("string_val", "2")  # dp group of rank 3
    assert r0[1].attrs["pg_name"] == ("string_val", "3")  # pp group of rank 0
    assert r0[2].attrs["comm_dst"] == ("int32_val", 2)
    assert r3[0].attrs["comm_src"] == ("int32_val", 1)
    assert "pg_name" not in r0[6].attrs  # no group: ASTRA-sim's all-ranks group
    for nodes in (r0, r3):
        for n in nodes:
            assert n.attrs["is_cpu_op"] == ("bool_val", False)


def test_units_flops_and_bytes(tmp_path):
    """num_ops is FLOPs (2 per multiply-add), sizes are bytes (bf16 = 2 bytes)."""
    m, k, n = 8 * 2048, 4096, 4 * 4096  # tokens x hidden -> 4*hidden
    flops = 2 * m * k * n
    touched = 2 * (m * k + k * n + m * n)
    grad_elems = k * n
    nodes = (
        ProgramNode(id=1, name="mlp_up", type=NodeType.COMP, num_ops=flops, tensor_size=touched),
        ProgramNode(id=2, name="grad_ar", type=NodeType.COMM_COLL, data_deps=(1,),
                    comm_type=0, comm_size=2 * grad_elems, group="dp"),
        ProgramNode(id=3, name="act_send", type=NodeType.COMM_SEND, data_deps=(1,),
                    peer="pp+1", tag=5, comm_size=2 * m * n),
    )
    et.write(_one_rank_job(*nodes, pg="7", peer=0), tmp_path)
    _, (mm, ar, send) = etread.read_et_file(tmp_path / "trace.0.et")
    assert mm.attrs["num_ops"] == ("int64_val", flops) and flops == 2 * (m * k * n)
    assert mm.attrs["tensor_size"] == ("uint64_val", touched)
    assert ar.attrs["comm_size"] == ("int64_val", 2 * grad_elems)
    assert ar.attrs["pg_name"] == ("string_val", "7")
    assert send.attrs["comm_size"] == ("int64_val", 2 * m * n)
    for node in (mm, ar, send):
        assert set(node.attrs) == set(CONTRACT[node.type])
        assert {a: kind for a, (kind, _) in node.attrs.items()} == CONTRACT[node.type]


def test_deterministic(make_job_fn, tmp_path):
    et.write(make_job_fn(), tmp_path / "a")
    et.write(make_job_fn(), tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == [f"trace.{r}.et" for r in range(4)]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def _protobuf_file(job, rank) -> bytes:
    """The same rank's file built with protobuf messages, the slow obvious way."""
    meta = schema.GlobalMetadata(version="0.0.4")
    meta.attr.add(name="generator", string_val=f"stage {stage_version}")  # who wrote it (validate reads it)
    out = [wire.frame(meta.SerializeToString())]
    for node in _program_of(job, rank).nodes:
        msg = schema.Node(id=node.id, name=node.name, type=int(node.type),
                          ctrl_deps=node.ctrl_deps, data_deps=node.data_deps,
                          duration_micros=node.duration_micros)
        for name, (kind, value) in expected_attrs(job, rank, node).items():
            msg.attr.add(name=name, **{kind: value})
        out.append(wire.frame(msg.SerializeToString()))
    return b"".join(out)


def test_files_byte_identical_to_protobuf(job, tmp_path):
    et.write(job, tmp_path)
    for rank in range(job.world_size):
        assert (tmp_path / f"trace.{rank}.et").read_bytes() == _protobuf_file(job, rank)


def test_comm_groups_file_is_read(job, tmp_path):
    et.write(job, tmp_path)
    (tmp_path / "comm_groups.json").write_text(json.dumps(dict(job.comm_groups)))
    assert etread.read(tmp_path).comm_groups == {k: list(v) for k, v in job.comm_groups.items()}


def test_iter_ranks_is_lazy(job, tmp_path):
    et.write(job, tmp_path)
    ts = etread.read(tmp_path)
    (tmp_path / "trace.2.et").write_bytes(b"\x07\x0a\x050.0.4\x40\x08")  # truncated node
    it = ts.iter_ranks()
    assert next(it)[0] == 0 and next(it)[0] == 1
    with pytest.raises(ChakraReadError, match="trace.2.et.*truncated"):
        next(it)


def test_reader_rejects_gaps_and_empty_version(job, tmp_path):
    et.write(job, tmp_path)
    (tmp_path / "trace.1.et").unlink()
    with pytest.raises(ChakraReadError, match=r"rank\(s\) \[1\]"):
        etread.read(tmp_path)
    (tmp_path / "trace.1.et").write_bytes(b"\x00")  # GlobalMetadata with no version
    with pytest.raises(ChakraReadError, match="no version"):
        list(etread.read(tmp_path).iter_ranks())


def test_detect(tmp_path, job):
    assert not etread.detect(tmp_path)
    assert not etread.detect(tmp_path / "missing")
    et.write(job, tmp_path)
    assert etread.detect(tmp_path)


def _one_rank_job(*nodes, **kw):
    return TraceJob(programs=(RankProgram(ranks=(0,), nodes=nodes),), world_size=1,
                    comm_groups={}, group_name=lambda r, k: kw.get("pg", "1"),
                    peer_rank=lambda r, k: kw.get("peer", 0))


@pytest.mark.parametrize("node,match", [
    (ProgramNode(id=3, name="c", type=NodeType.COMP, num_ops=1.5e9, tensor_size=8),
     r"node 3 \('c'\)"),
    (ProgramNode(id=4, name="k", type=NodeType.COMM_COLL, comm_size=8), "comm_type"),
    (ProgramNode(id=5, name="s", type=NodeType.COMM_SEND, comm_size=8), "peer"),
    (ProgramNode(id=6, name="t", type=NodeType.COMP, num_ops=1, tensor_size=-1), "uint64"),
])
def test_bad_nodes_are_named(node, match, tmp_path):
    with pytest.raises(ChakraWriteError, match=match):
        et.write(_one_rank_job(node), tmp_path)


def test_bad_resolved_peer_is_named(tmp_path):
    node = ProgramNode(id=1, name="s", type=NodeType.COMM_SEND, peer="pp+1", comm_size=8)
    with pytest.raises(ChakraWriteError, match="rank 0: comm_dst from peer 'pp\\+1'"):
        et.write(_one_rank_job(node, peer=1 << 40), tmp_path)


def test_rank_coverage_checked(job, tmp_path):
    job.world_size = 5
    with pytest.raises(ChakraWriteError, match=r"no program for 1 rank\(s\), first \[4\]"):
        et.write(job, tmp_path)
    job.world_size = 4
    job.programs = list(job.programs) + [RankProgram(ranks=(1,), nodes=())]
    with pytest.raises(ChakraWriteError, match="rank 1 is in programs"):
        et.write(job, tmp_path)
    assert not list(tmp_path.iterdir())  # checked before anything is written


def test_shared_program_splices_only_dynamic_nodes(job):
    from stage_adapter_chakra.stamp import compile_program

    stamp = compile_program(job.programs[1], et.EtEncoding())  # stage 0
    dynamic = [n for n in job.programs[1].nodes
               if n.group is not None or n.peer is not None]
    assert sum(not isinstance(r, bytes) for r in stamp.runs) == len(dynamic) == 4
    assert {(s.source, s.key) for s in stamp.slots} == {("group", "pp"), ("group", "dp"),
                                                        ("peer", "pp+1")}
    # the fixed runs between them: header and node 0, node 4, nodes 6 and 300
    assert sum(isinstance(r, bytes) for r in stamp.runs) == 3


def test_each_key_resolved_once_per_rank(job, tmp_path):
    calls = []
    group_name, peer_rank = job.group_name, job.peer_rank
    job.group_name = lambda r, k: calls.append(("group", r, k)) or group_name(r, k)
    job.peer_rank = lambda r, k: calls.append(("peer", r, k)) or peer_rank(r, k)
    et.write(job, tmp_path)
    assert len(calls) == len(set(calls))
    assert sorted(c for c in calls if c[1] == 0) == [
        ("group", 0, "dp"), ("group", 0, "pp"), ("peer", 0, "pp+1")]


# --------------------------------------------------------------------------- many ranks, many writers


def _wide_job(small: TraceJob, world: int = 96) -> TraceJob:
    """pp2 x dp(world/2): the two programs of the ``job`` fixture, on many ranks.

    Rank r is stage r // half, data-parallel index r % half; dp groups "1" and "2",
    pp groups "3".. ; peers are half a world away."""
    stage1, stage0 = small.programs
    half = world // 2
    groups = {"1": list(range(half)), "2": list(range(half, world))}
    groups.update({str(3 + i): [i, half + i] for i in range(half)})

    def group_name(rank, key):
        stage, index = divmod(rank, half)
        return str(1 + stage) if key == "dp" else str(3 + index)

    def peer_rank(rank, key):
        return rank + half if key == "pp+1" else rank - half

    programs = (RankProgram(tuple(range(half, world)), stage1.nodes, "stage1"),
                RankProgram(tuple(range(half)), stage0.nodes, "stage0"))
    return TraceJob(programs=programs, world_size=world, comm_groups=groups,
                    group_name=group_name, peer_rank=peer_rank)


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("fmt", ["et", "json"])
def test_same_bytes_with_one_and_many_writers(job, tmp_path, monkeypatch, fmt):
    from stage_adapter_chakra import jsontrace, writer

    write = et.write if fmt == "et" else jsontrace.write
    one, many = _wide_job(job), _wide_job(job)
    one.workers = 1
    write(one, tmp_path / "one")
    # small batches and no minimum, so that three processes share 96 files; each
    # process leaves its pid beside the files it wrote
    monkeypatch.setattr(writer, "BATCH", 5)
    monkeypatch.setattr(writer, "MIN_FILES_PER_WORKER", 1)
    real = writer._write_file

    def write_file(path, data):
        real(path, data)
        (path.parent.parent / f"pid.{os.getpid()}").touch()

    monkeypatch.setattr(writer, "_write_file", write_file)
    counts = []
    many.workers, many.progress = 3, counts.append
    write(many, tmp_path / "many")
    assert len(list(tmp_path.glob("pid.*"))) > 1  # really written by several processes
    assert sorted(counts) == [3] * 2 + [5] * 18  # 48 ranks a class: 9 batches of 5, one of 3
    files = _files(tmp_path / "one")
    assert len(files) == 96 and files == _files(tmp_path / "many")


def test_written_values_follow_the_ranks(job, tmp_path):
    job = _wide_job(job)
    et.write(job, tmp_path)
    for rank in (0, 47, 48, 95):
        _, nodes = etread.read_et_file(tmp_path / f"trace.{rank}.et")
        program = _program_of(job, rank)
        for got, want in zip(nodes, program.nodes):
            assert got.attrs == expected_attrs(job, rank, want)


def test_a_subset_of_ranks(job, tmp_path):
    full, part = _wide_job(job), _wide_job(job)
    et.write(full, tmp_path / "full")
    part.ranks = [0, 3, 47, 48, 90]
    assert et.write(part, tmp_path / "part") is None
    got = _files(tmp_path / "part")
    assert sorted(got) == sorted(f"trace.{r}.et" for r in part.ranks)
    assert got == {name: data for name, data in _files(tmp_path / "full").items() if name in got}
    part.ranks = [3, 96]
    with pytest.raises(ChakraWriteError, match=r"rank 96 asked for is outside 0..95"):
        et.write(part, tmp_path / "bad")


def test_array_resolvers_give_the_same_bytes(job, tmp_path):
    import numpy as np

    scalar, arrays = _wide_job(job), _wide_job(job)
    calls = []

    def group_ids(key, ranks):
        calls.append(len(ranks))
        return np.array([int(scalar.group_name(int(r), key)) for r in ranks])

    arrays.group_ids = group_ids
    arrays.peer_ranks = lambda key, ranks: np.array([scalar.peer_rank(int(r), key) for r in ranks])
    arrays.group_name = arrays.peer_rank = None  # not called
    et.write(scalar, tmp_path / "scalar")
    et.write(arrays, tmp_path / "arrays")
    assert calls and max(calls) > 1  # whole batches at once
    assert _files(tmp_path / "scalar") == _files(tmp_path / "arrays")
