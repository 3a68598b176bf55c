"""The ``chakra`` backend's reader: decode Chakra ET files and directories of them."""

from __future__ import annotations

import gzip
import zlib
from multiprocessing import get_all_start_methods
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from stage_core.api import TraceNode, TraceSet

from . import schema, stampread, traceset, wire
from .convert import metadata
from .errors import ChakraReadError
from .et import FORMAT_ID
from .records import BadRecord, NodeDecoder
from .parallelread import read_files
from .stampread import StampDecoder
from .writer import default_workers


def _load(path: Path) -> bytes:
    """The bytes of the file at ``path`` (gunzipped: Chakra's own reader accepts gzip too)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ChakraReadError(f"cannot read it ({exc.strerror or exc})", path=path) from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise ChakraReadError(f"not a readable gzip file ({exc})", path=path) from None
    return data


def decode_et(data: bytes, where: str = "trace",
              decoder: NodeDecoder | None = None) -> tuple[dict[str, Any], list[TraceNode]]:
    """``(metadata, nodes)`` of one trace file's bytes.

    With a ``decoder`` (one per set, see :mod:`.records`) nodes are shared with the
    files it decoded before wherever their records are the same bytes.
    """
    if not data:
        raise ChakraReadError("empty file, no GlobalMetadata record", path=where, offset=0)
    data = bytes(data)  # records are sliced out and hashed: bytes, not a buffer
    try:
        header, pos = wire.read_frame(data, 0)
        meta = metadata(schema.GlobalMetadata.FromString(header))
    except (DecodeError, ValueError) as exc:
        if isinstance(exc, wire.FrameError):
            raise ChakraReadError(str(exc), path=where, offset=exc.offset) from None
        raise ChakraReadError(f"record at byte 0: {exc}", path=where, offset=0) from exc
    try:
        if isinstance(decoder, stampread.StampDecoder):
            nodes = decoder.decode(data, pos, where)
        else:
            nodes = (NodeDecoder() if decoder is None else decoder).decode(data, pos)
    except BadRecord as exc:
        raise ChakraReadError(str(exc), path=where, offset=exc.offset) from exc.__cause__
    return meta, nodes


def read_et_file(path: Path,
                 decoder: NodeDecoder | None = None) -> tuple[dict[str, Any], list[TraceNode]]:
    """``(metadata, nodes)`` of the trace file at ``path`` (``decoder``: see decode_et)."""
    return decode_et(_load(path), str(path), decoder)


def read_et_header(path: Path) -> dict[str, Any]:
    """Only the GlobalMetadata of the trace file at ``path``."""
    data = _load(path)
    try:
        record, _ = wire.read_frame(data, 0)
        return metadata(schema.GlobalMetadata.FromString(record))
    except (IndexError, DecodeError, ValueError) as exc:
        raise ChakraReadError(f"no readable GlobalMetadata record ({exc})", path=path, offset=0) from exc


#: sets of fewer files are read in this process alone
MIN_FILES_PARALLEL = 512


def read(directory: Path, workers: int | None = None) -> TraceSet:
    """The ``chakra`` backend's reader: a directory of ``<prefix>.<rank>.et`` files.

    A set of many files is read by ``workers`` processes (None: one per core; see
    :mod:`.parallelread`)."""
    def file_reader():  # one decoder per pass over the set
        decoder = StampDecoder()
        return lambda path: read_et_file(path, decoder)

    def files_reader(paths):
        count = workers or default_workers()
        if count < 2 or len(paths) < MIN_FILES_PARALLEL or "fork" not in get_all_start_methods():
            return None
        return read_files(paths, count)

    return traceset.open_set(Path(directory), "et", read_et_file, read_et_header, FORMAT_ID,
                             file_reader=file_reader, files_reader=files_reader)


def detect(directory: Path) -> bool:
    """Whether ``directory`` holds Chakra ET files."""
    return traceset.detect(Path(directory), "et")
