"""The ``chakra`` backend's reader: decode Chakra ET files and directories of them."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from stage_core.trace import TraceNode, TraceSet

from . import schema, traceset, wire
from .convert import metadata, trace_node
from .errors import ChakraReadError
from .et import FORMAT_ID


def _load(path: Path) -> bytes:
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":  # Chakra's own reader accepts gzip too
        data = gzip.decompress(data)
    return data


def decode_et(data: bytes, where: str = "trace") -> tuple[dict[str, Any], list[TraceNode]]:
    """``(metadata, nodes)`` of one trace file's bytes."""
    frames = wire.iter_frames(data)
    offset = 0
    try:
        first = next(frames, None)
        if first is None:
            raise ChakraReadError(f"{where}: empty file, no GlobalMetadata record")
        offset = first[0]
        meta = metadata(schema.GlobalMetadata.FromString(bytes(first[1])))
        node = schema.Node()
        nodes = []
        for offset, record in frames:
            node.ParseFromString(bytes(record))
            nodes.append(trace_node(node))
    except (DecodeError, ValueError) as exc:
        if isinstance(exc, ChakraReadError):
            raise
        raise ChakraReadError(f"{where}: record at byte {offset}: {exc}") from exc
    return meta, nodes


def read_et_file(path: Path) -> tuple[dict[str, Any], list[TraceNode]]:
    """``(metadata, nodes)`` of the trace file at ``path``."""
    return decode_et(_load(path), str(path))


def read_et_header(path: Path) -> dict[str, Any]:
    """Only the GlobalMetadata of the trace file at ``path``."""
    data = _load(path)
    try:
        _, record = next(wire.iter_frames(data))
        return metadata(schema.GlobalMetadata.FromString(bytes(record)))
    except (StopIteration, DecodeError, ValueError) as exc:
        raise ChakraReadError(f"{path}: no readable GlobalMetadata record ({exc})") from exc


def read(directory: Path) -> TraceSet:
    """The ``chakra`` backend's reader: a directory of ``<prefix>.<rank>.et`` files."""
    return traceset.open_set(Path(directory), "et", read_et_file, read_et_header, FORMAT_ID)


def detect(directory: Path) -> bool:
    """Whether ``directory`` holds Chakra ET files."""
    return traceset.detect(Path(directory), "et")
