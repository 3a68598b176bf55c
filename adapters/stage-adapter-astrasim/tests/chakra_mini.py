"""A tiny hand-rolled Chakra ET writer, only for the real-simulator integration test.

Writes, per rank, GlobalMetadata(version "0.0.4") then two nodes: a GPU COMP node and a
1 MiB ALL_REDUCE on process group "1" that depends on it (mlcommons/chakra
``schema/protobuf/et_def.proto`` field numbers; varint-length-prefixed stream).  It
exists so this package's tests need no other STAGE package and no protobuf library.
"""

from __future__ import annotations

import json
from pathlib import Path


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, n: int) -> bytes:
    return _key(field, 0) + _varint(n)


def _bytes(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _attr(name: str, *, i64: int | None = None, boolean: bool | None = None,
          string: str | None = None) -> bytes:
    body = _bytes(1, name.encode())
    if i64 is not None:
        body += _int(9, i64)  # int64_val
    if boolean is not None:
        body += _int(27, int(boolean))  # bool_val (oneof: written even when false)
    if string is not None:
        body += _bytes(29, string.encode())  # string_val
    return body


def _node(node_id: int, name: str, node_type: int, attrs: list[bytes],
          data_deps: tuple[int, ...] = ()) -> bytes:
    body = _int(1, node_id) + _bytes(2, name.encode()) + _int(3, node_type)
    if data_deps:
        body += _bytes(5, b"".join(_varint(d) for d in data_deps))  # packed
    for attr in attrs:
        body += _bytes(10, attr)
    return body


def _framed(message: bytes) -> bytes:
    return _varint(len(message)) + message


def write_trace_set(root: Path, world: int, comm_bytes: int = 1 << 20) -> None:
    """trace.<r>.et for every rank, comm_groups.json and manifest.json."""
    root.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        comp = _node(1, "gemm", 4, [_attr("is_cpu_op", boolean=False),
                                    _attr("num_ops", i64=2 * 4096 ** 3),
                                    _attr("tensor_size", i64=3 * 2 * 4096 ** 2)])
        coll = _node(2, "all_reduce", 7, [_attr("is_cpu_op", boolean=False),
                                          _attr("comm_type", i64=0),
                                          _attr("comm_size", i64=comm_bytes),
                                          _attr("pg_name", string="1")], data_deps=(1,))
        data = _framed(_bytes(1, b"0.0.4")) + _framed(comp) + _framed(coll)
        (root / f"trace.{rank}.et").write_bytes(data)
    (root / "comm_groups.json").write_text(json.dumps({"1": list(range(world))}))
    (root / "manifest.json").write_text(json.dumps({"world_size": world}))
