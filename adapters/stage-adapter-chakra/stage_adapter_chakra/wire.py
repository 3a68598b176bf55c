"""Hand-rolled protobuf wire format for the Chakra Node subset STAGE writes.

The output is byte-identical to protobuf's ``SerializeToString`` of the same
message (fields in number order, proto3 defaults omitted, packed repeated
varints, oneof members written even when zero); the tests check this against
the runtime.  Also here: the varint length framing of a trace file, both ways.

Field numbers (``et_def.proto``): Node id 1, name 2, type 3, ctrl_deps 4,
data_deps 5, attr 10; GlobalMetadata version 1; AttributeProto name 1 and the
value oneof (int32_val 7, int64_val 9, uint64_val 13, bool_val 27,
string_val 29).
"""

from __future__ import annotations

from operator import index
from typing import Any, Iterable, Iterator

MASK64 = (1 << 64) - 1
_BYTE = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    """Base-128 varint of ``0 <= value < 2**64``."""
    if 0 <= value < 128:
        return _BYTE[value]
    if value < 0 or value > MASK64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def _len_field(field_key: bytes, payload: bytes) -> bytes:
    return field_key + varint(len(payload)) + payload


# ---------------------------------------------------------------- scalar values


def _int64(value: Any) -> bytes:
    v = index(value)
    if not -(1 << 63) <= v < (1 << 63):
        raise ValueError(f"int64 out of range: {v}")
    return varint(v & MASK64)


def _uint64(value: Any) -> bytes:
    v = index(value)
    if not 0 <= v <= MASK64:
        raise ValueError(f"uint64 out of range: {v}")
    return varint(v)


def _int32(value: Any) -> bytes:
    v = index(value)
    if not -(1 << 31) <= v < (1 << 31):
        raise ValueError(f"int32 out of range: {v}")
    return varint(v & MASK64)  # negative int32 is sign-extended to 10 bytes


def _bool(value: Any) -> bytes:
    if not isinstance(value, (bool, int)):
        raise TypeError(f"bool expected, got {type(value).__name__}")
    return b"\x01" if value else b"\x00"


def _string(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"str expected, got {type(value).__name__}")
    data = value.encode("utf-8")
    return varint(len(data)) + data


#: oneof member -> (field key bytes, value encoder)
ATTR_VALUE = {
    "int32_val": (_key(7, 0), _int32),
    "int64_val": (_key(9, 0), _int64),
    "uint64_val": (_key(13, 0), _uint64),
    "bool_val": (_key(27, 0), _bool),
    "string_val": (_key(29, 2), _string),
}


def check(kind: str, value: Any) -> int | str | bool:
    """Check ``value`` fits oneof member ``kind``; return it as a plain Python value."""
    encode = ATTR_VALUE[kind][1]
    encode(value)
    return value if kind in ("string_val", "bool_val") else index(value)


_NODE_ID, _NODE_NAME, _NODE_TYPE = _key(1, 0), _key(2, 2), _key(3, 0)
_NODE_CTRL, _NODE_DATA, _NODE_ATTR = _key(4, 2), _key(5, 2), _key(10, 2)
_NODE_DURATION = _key(7, 0)
_ATTR_NAME = _key(1, 2)
_META_VERSION, _META_ATTR = _key(1, 2), _key(2, 2)


# ---------------------------------------------------------------- messages


def _attribute_body(name: str, kind: str, value: Any) -> bytes:
    try:
        value_key, encode = ATTR_VALUE[kind]
    except KeyError:
        raise ValueError(f"unsupported attribute kind {kind!r}") from None
    body = value_key + encode(value)
    if name:
        body = _ATTR_NAME + _string(name) + body
    return body


def attribute(name: str, kind: str, value: Any) -> bytes:
    """One ``Node.attr`` entry, field key and length included."""
    return _len_field(_NODE_ATTR, _attribute_body(name, kind, value))


def _packed(field_key: bytes, values: Iterable[int]) -> bytes:
    payload = b"".join([_uint64(v) for v in values])
    return _len_field(field_key, payload) if payload else b""


def node_head(node_id: int, name: str, node_type: int,
              ctrl_deps: Iterable[int] = (), data_deps: Iterable[int] = (),
              duration_micros: int = 0) -> bytes:
    """Node fields 1-7 (everything before the attributes)."""
    parts = []
    if index(node_id):
        parts.append(_NODE_ID + _uint64(node_id))
    if name:
        parts.append(_NODE_NAME + _string(name))
    if index(node_type):
        parts.append(_NODE_TYPE + _int32(node_type))  # enums encode as int32
    parts.append(_packed(_NODE_CTRL, ctrl_deps))
    parts.append(_packed(_NODE_DATA, data_deps))
    if index(duration_micros):
        parts.append(_NODE_DURATION + _uint64(duration_micros))
    return b"".join(parts)


def metadata(version: str, attrs: Iterable[tuple[str, str, Any]] = ()) -> bytes:
    """A GlobalMetadata message body with ``version`` set and ``attrs`` ((name, kind,
    value) each) as its attributes."""
    body = _META_VERSION + _string(version) if version else b""
    return body + b"".join(_len_field(_META_ATTR, _attribute_body(*a)) for a in attrs)


def frame(body: bytes) -> bytes:
    """``body`` with its varint length prefix, as a trace file stores it."""
    return varint(len(body)) + body


# ---------------------------------------------------------------- reading


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; return ``(value, next_pos)``."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise ValueError("varint longer than 10 bytes")


def iter_frames(data: bytes) -> Iterator[tuple[int, memoryview]]:
    """Yield ``(offset, message bytes)`` for each length-prefixed record."""
    view = memoryview(data)
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        size, pos = read_varint(data, pos)
        if pos + size > end:
            raise ValueError(
                f"truncated record at byte {start}: needs {size} bytes, {end - pos} left")
        yield start, view[pos:pos + size]
        pos += size


class FrameError(ValueError):
    """A record that cannot be framed, at byte ``offset`` (its length prefix)."""

    def __init__(self, offset: int, reason: str):
        super().__init__(f"record at byte {offset}: {reason}")
        self.offset, self.reason = offset, reason


def read_frame(data: bytes, pos: int) -> tuple[bytes, int]:
    """The record whose length prefix starts at ``pos``, and the position after it.

    :class:`FrameError` on a bad length prefix or a record running past the end.
    """
    end = len(data)
    size = data[pos]
    if size < 0x80:  # one-byte length: records under 128 bytes
        body = pos + 1
    elif pos + 1 < end and data[pos + 1] < 0x80:  # two bytes: under 16 KiB
        size = (size & 0x7F) | data[pos + 1] << 7
        body = pos + 2
    else:
        try:
            size, body = read_varint(data, pos)
        except ValueError as exc:
            raise FrameError(pos, str(exc)) from None
    stop = body + size
    if stop > end:
        raise FrameError(pos, f"truncated, needs {size} bytes, {end - body} left")
    return data[body:stop], stop


def split_frames(data: bytes, pos: int = 0) -> tuple[list[bytes], list[int]]:
    """``(records, starts)``: every length-prefixed record of ``data`` from ``pos`` on,
    as bytes, and the offset of each one's length prefix, plus the end of the last.

    The framing of :func:`iter_frames` (and :func:`read_frame`'s errors), in one pass
    that copies each record out, so that a record can be hashed.
    """
    records: list[bytes] = []
    starts: list[int] = []
    add_record, add_start = records.append, starts.append
    end = len(data)
    while pos < end:
        add_start(pos)
        size = data[pos]
        if size < 0x80:
            body = pos + 1
        elif pos + 1 < end and data[pos + 1] < 0x80:
            size = (size & 0x7F) | data[pos + 1] << 7
            body = pos + 2
        else:
            record, pos = read_frame(data, pos)
            add_record(record)
            continue
        stop = body + size
        if stop > end:
            raise FrameError(pos, f"truncated, needs {size} bytes, {end - body} left")
        add_record(data[body:stop])
        pos = stop
    add_start(pos)
    return records, starts
