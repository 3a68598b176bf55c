"""The chakra-json backend: protobuf's JSON mapping, same content as the .et files."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format

from stage_adapter_chakra import ChakraReadError, et, etread, jsonread, jsontrace, wire
from stage_adapter_chakra import schema


def test_same_content_as_binary(job, tmp_path):
    et.write(job, tmp_path / "et")
    jsontrace.write(job, tmp_path / "json")
    ets, jss = etread.read(tmp_path / "et"), jsonread.read(tmp_path / "json")
    assert jss.world_size == ets.world_size == 4
    assert jss.metadata["version"] == "0.0.4"
    assert jss.metadata["format"] == "chakra-json-0.0.4"
    assert list(jss.iter_ranks()) == list(ets.iter_ranks())


def test_text_is_protobufs_json_mapping(job, tmp_path):
    et.write(job, tmp_path)
    jsontrace.write(job, tmp_path)
    for rank in range(job.world_size):
        doc = json.loads((tmp_path / f"trace.{rank}.json").read_text("utf-8"))
        data = (tmp_path / f"trace.{rank}.et").read_bytes()
        frames = [bytes(rec) for _, rec in wire.iter_frames(data)]
        meta = schema.GlobalMetadata.FromString(frames[0])
        assert doc["metadata"] == json_format.MessageToDict(meta)
        assert len(doc["nodes"]) == len(frames) - 1
        for obj, rec in zip(doc["nodes"], frames[1:]):
            assert obj == json_format.MessageToDict(schema.Node.FromString(rec))
            assert list(obj) == [k for k in ("id", "name", "type", "ctrlDeps", "dataDeps", "durationMicros",
                                              "attr") if k in obj]  # field-number order


def test_json_spellings(job, tmp_path):
    jsontrace.write(job, tmp_path)
    doc = json.loads((tmp_path / "trace.0.json").read_text("utf-8"))
    fwd, ag, send = doc["nodes"][:3]
    assert "id" not in fwd  # id 0 is proto3's default
    assert ag["type"] == "COMM_COLL_NODE" and ag["dataDeps"] == ["0"]
    assert {"name": "num_ops", "int64Val": str(3 * (1 << 40) + 12345)} in fwd["attr"]
    assert {"name": "tensor_size", "uint64Val": str(6 << 30)} in fwd["attr"]
    assert {"name": "pg_name", "stringVal": "3"} in ag["attr"]
    assert {"name": "comm_dst", "int32Val": 2} in send["attr"]
    assert {"name": "is_cpu_op", "boolVal": False} in send["attr"]


def test_deterministic(make_job_fn, tmp_path):
    jsontrace.write(make_job_fn(), tmp_path / "a")
    jsontrace.write(make_job_fn(), tmp_path / "b")
    for rank in range(4):
        name = f"trace.{rank}.json"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_detect_and_errors(job, tmp_path):
    assert not jsonread.detect(tmp_path)
    jsontrace.write(job, tmp_path)
    assert jsonread.detect(tmp_path) and not etread.detect(tmp_path)
    (tmp_path / "trace.1.json").write_text('{"metadata": {"version": "0.0.4"}, "nodes": [{"idd": 1}]}')
    with pytest.raises(ChakraReadError, match="trace.1.json: node #0"):
        list(jsonread.read(tmp_path).iter_ranks())
    (tmp_path / "trace.1.json").write_text("{")
    with pytest.raises(ChakraReadError, match="not JSON"):
        list(jsonread.read(tmp_path).iter_ranks())
