"""The schema: built at import time, no warnings, numbers as REFERENCE §6 states."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from stage_core.api import CollectiveType, NodeType

from stage_adapter_chakra import protoparse, schema

# Imports everything, then touches every sub-message field of every message (a
# dangling schema buffer once crashed exactly there, on protobuf 4.22).
IMPORT_ALL = """
import gc
import stage_adapter_chakra, stage_adapter_chakra.plugin
from stage_adapter_chakra import schema as s
gc.collect()
n = s.Node(id=1)
n.attr.add(name="x", int64_val=2)
assert s.Node.FromString(n.SerializeToString()) == n
file = s.POOL.FindFileByName("stage_adapter_chakra/et_def.proto")
for desc in file.message_types_by_name.values():
    msg = s.CLASSES[desc.full_name]()
    for field in msg.DESCRIPTOR.fields:
        if field.message_type is not None:
            value = getattr(msg, field.name)
            value.add() if hasattr(value, "add") else value.SetInParent()
    type(msg).FromString(msg.SerializeToString())
"""


@pytest.mark.parametrize("impl", [None, "python"])
def test_import_raises_no_warning(impl):
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    if impl:
        env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = impl
    proc = subprocess.run([sys.executable, "-W", "error", "-c", IMPORT_ALL],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def _fields(name):
    return {f.name: f.number for f in schema.message(name).DESCRIPTOR.fields}


def test_node_fields_match_reference():
    fields = _fields("Node")
    assert {k: fields[k] for k in (
        "id", "name", "type", "ctrl_deps", "data_deps", "start_time_micros",
        "duration_micros", "inputs", "outputs", "attr")} == {
        "id": 1, "name": 2, "type": 3, "ctrl_deps": 4, "data_deps": 5,
        "start_time_micros": 6, "duration_micros": 7, "inputs": 8, "outputs": 9, "attr": 10}
    assert _fields("GlobalMetadata") == {"version": 1, "attr": 2}


def test_attribute_oneof_numbers():
    desc = schema.AttributeProto.DESCRIPTOR
    fields = _fields("AttributeProto")
    assert fields["name"] == 1 and fields["doc_string"] == 2
    assert fields["int64_val"] == 9 and fields["uint64_val"] == 13
    assert fields["bool_val"] == 27 and fields["string_val"] == 29
    assert fields["int32_val"] == 7
    oneof = desc.oneofs_by_name["value"]
    assert sorted(f.number for f in oneof.fields) == list(range(3, 33))


def test_enums_match_reference_and_core():
    node_types = {v: k for k, v in schema.NODE_TYPE_NAMES.items()}
    for member in NodeType:
        assert node_types[f"{member.name}_NODE"] == member.value
    comm = {v: k for k, v in schema.COMM_TYPE_NAMES.items()}
    for member in CollectiveType:
        assert comm[member.name] == member.value
    assert comm["ALL_REDUCE"] == 0 and comm["REDUCE_SCATTER"] == 7 and comm["BARRIER"] == 9


def test_packed_repeated_deps():
    field = schema.Node.DESCRIPTOR.fields_by_name["data_deps"]
    n = schema.Node(data_deps=[1, 2, 300])
    assert n.SerializeToString() == b"\x2a\x04\x01\x02\xac\x02"  # packed, one length
    assert field.number == 5


def test_optional_storage_has_presence():
    n = schema.Node()
    assert not n.HasField("storage")
    n.storage.level = 0
    assert n.HasField("storage")


def test_nested_enum_resolves():
    fs = schema.message("FsOp")
    assert fs.DESCRIPTOR.fields_by_name["op"].enum_type.full_name == "ChakraProtoMsg.FsOp.Op"
    assert fs.DESCRIPTOR.enum_types_by_name["Op"].values_by_name["FS_OP_FSYNC"].number == 7


def test_parser_rejects_what_it_does_not_support():
    with pytest.raises(protoparse.ProtoSyntaxError, match="line 3"):
        protoparse.parse('syntax = "proto3";\npackage p;\nimport "x.proto";\n', "t.proto")
    with pytest.raises(protoparse.ProtoSyntaxError, match="proto3"):
        protoparse.parse('syntax = "proto2";', "t.proto")
    with pytest.raises(protoparse.ProtoSyntaxError, match="unknown type"):
        protoparse.parse('syntax = "proto3";\nmessage A { B b = 1; }', "t.proto")
    with pytest.raises(protoparse.ProtoSyntaxError, match="options"):
        protoparse.parse('syntax = "proto3";\nmessage A { repeated int32 v = 1 [packed=false]; }',
                         "t.proto")


def test_parser_scoping_and_json_names():
    fdp = protoparse.parse(
        'syntax = "proto3"; package p; /* block */\n'
        "message Outer { message Inner { int32 x_y = 1; } Inner a = 1; }\n"
        "message Other { Outer.Inner b = 1; repeated uint64 ctrl_deps = 2; }", "t.proto")
    outer, other = fdp.message_type
    assert outer.field[0].type_name == ".p.Outer.Inner"
    assert other.field[0].type_name == ".p.Outer.Inner"
    assert other.field[1].json_name == "ctrlDeps"
    assert outer.nested_type[0].field[0].json_name == "xY"
