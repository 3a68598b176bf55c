"""The hand-rolled encoder is byte-identical to protobuf's SerializeToString."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from stage_adapter_chakra import schema, wire

KINDS = ("bool_val", "int64_val", "uint64_val", "int32_val", "string_val")
NAMES = ["", "x", "fwd_layer0", "ñame_ünïcode_✓", "a" * 200]


def _value(rng: random.Random, kind: str):
    if kind == "bool_val":
        return rng.random() < 0.5
    if kind == "string_val":
        return rng.choice(NAMES + [str(rng.randrange(1, 10**6))])
    lo, hi = {"int64_val": (-(1 << 63), (1 << 63) - 1), "uint64_val": (0, (1 << 64) - 1),
              "int32_val": (-(1 << 31), (1 << 31) - 1)}[kind]
    edge = [lo, hi, 0, 1, 127, 128, 16383, 16384, -1 if lo < 0 else 2, 1 << 31]
    pick = rng.choice(edge + [rng.randint(lo, hi)] * 3 + [rng.randint(0, 1 << 20)])
    return max(lo, min(hi, pick))


def random_node(rng: random.Random):
    """(protobuf message, hand-encoded body) for one random node."""
    node_id = rng.choice([0, 1, 127, 128, (1 << 64) - 1, rng.randrange(1 << 40)])
    name = rng.choice(NAMES)
    node_type = rng.randrange(0, 11)
    ctrl = [rng.choice([0, 5, 300, (1 << 64) - 1, rng.randrange(1 << 35)])
            for _ in range(rng.choice([0, 0, 1, 3, 40]))]
    data = [rng.randrange(1 << rng.choice([7, 14, 21, 63])) for _ in range(rng.choice([0, 1, 2, 9]))]
    attrs = [(rng.choice(NAMES), kind, _value(rng, kind))
             for kind in rng.choices(KINDS, k=rng.randrange(0, 7))]
    msg = schema.Node(id=node_id, name=name, type=node_type, ctrl_deps=ctrl, data_deps=data)
    for attr_name, kind, value in attrs:
        msg.attr.add(name=attr_name, **{kind: value})
    body = wire.node_head(node_id, name, node_type, ctrl, data) + b"".join(
        wire.attribute(*a) for a in attrs)
    return msg, body


def test_random_nodes_are_byte_identical():
    rng = random.Random(20240601)
    for _ in range(3000):
        msg, body = random_node(rng)
        assert body == msg.SerializeToString(), msg


def test_framed_stream_matches():
    rng = random.Random(7)
    msgs, stream = [], b""
    for _ in range(200):
        msg, body = random_node(rng)
        msgs.append(msg)
        stream += wire.frame(body)
    decoded = [schema.Node.FromString(bytes(rec)) for _, rec in wire.iter_frames(stream)]
    assert decoded == msgs


def test_metadata_header():
    assert wire.frame(wire.metadata("0.0.4")) == b"\x07\x0a\x050.0.4"
    assert wire.metadata("0.0.4") == schema.GlobalMetadata(version="0.0.4").SerializeToString()


def test_zero_oneof_values_are_written():
    """A oneof member set to 0/false/"" is still present (unlike plain proto3 fields)."""
    for kind, zero in (("int64_val", 0), ("bool_val", False), ("string_val", ""),
                       ("uint64_val", 0), ("int32_val", 0)):
        msg = schema.Node()
        msg.attr.add(name="z", **{kind: zero})
        assert wire.attribute("z", kind, zero) == msg.SerializeToString()


@pytest.mark.parametrize("kind,value", [
    ("int64_val", 1 << 63), ("int64_val", -(1 << 63) - 1), ("uint64_val", -1),
    ("uint64_val", 1 << 64), ("int32_val", 1 << 31), ("int32_val", -(1 << 31) - 1)])
def test_out_of_range_rejected_like_protobuf(kind, value):
    with pytest.raises(ValueError):
        wire.attribute("v", kind, value)
    with pytest.raises(ValueError):
        schema.AttributeProto(name="v", **{kind: value})


def test_floats_rejected():
    with pytest.raises(TypeError):
        wire.attribute("num_ops", "int64_val", 1.5e9)


def test_varint_round_trip():
    for v in [0, 1, 127, 128, 300, 16384, (1 << 63), (1 << 64) - 1]:
        assert wire.read_varint(wire.varint(v), 0) == (v, len(wire.varint(v)))


def test_truncated_stream_rejected():
    data = wire.frame(b"\x08\x01") + wire.frame(b"\x08\x02\x12\x01a")[:-2]
    with pytest.raises(ValueError, match="truncated"):
        list(wire.iter_frames(data))


PURE_PYTHON_CHECK = """
import random, sys
sys.path.insert(0, sys.argv[1])
from google.protobuf.internal import api_implementation
assert api_implementation.Type() == "python", api_implementation.Type()
from test_wire import random_node
rng = random.Random(99)
for _ in range(500):
    msg, body = random_node(rng)
    assert body == msg.SerializeToString(), msg
print("ok")
"""


def test_identical_under_pure_python_protobuf():
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", PURE_PYTHON_CHECK, here],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
