"""The ``chakra-json`` backend's reader: decode its files and directories of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from stage_core.api import TraceNode, TraceSet

from . import schema, traceset
from .convert import metadata, trace_node
from .errors import ChakraReadError
from .jsontrace import FORMAT_ID


def _document(text: str, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ChakraReadError(f"not JSON ({exc})", path=where) from None
    except RecursionError:
        raise ChakraReadError("not JSON STAGE reads (nested too deep)", path=where) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise ChakraReadError('expected {"metadata": ..., "nodes": [...]}', path=where)
    return doc


def _text(path: Path) -> str:
    try:
        return Path(path).read_text("utf-8")
    except OSError as exc:
        raise ChakraReadError(f"cannot read it ({exc.strerror or exc})", path=path) from None
    except UnicodeDecodeError as exc:
        raise ChakraReadError(f"not UTF-8 text ({exc.reason})", path=path, offset=exc.start) from None


def _parse(obj: Any, message, where: str):
    try:
        return json_format.ParseDict(obj, message)
    except (json_format.ParseError, TypeError) as exc:  # TypeError: a node that is not an object
        raise ChakraReadError(f"{where}: {exc}") from None


def decode_json(text: str, where: str = "trace") -> tuple[dict[str, Any], list[TraceNode]]:
    """``(metadata, nodes)`` of one ``chakra-json`` document."""
    doc = _document(text, where)
    meta = _parse(doc.get("metadata", {}), schema.GlobalMetadata(), f"{where}: metadata")
    nodes = []
    for i, obj in enumerate(doc["nodes"]):
        nodes.append(trace_node(_parse(obj, schema.Node(), f"{where}: node #{i}")))
    return metadata(meta), nodes


def read_json_file(path: Path) -> tuple[dict[str, Any], list[TraceNode]]:
    """``(metadata, nodes)`` of the ``chakra-json`` file at ``path``."""
    return decode_json(_text(path), str(path))


def read_json_header(path: Path) -> dict[str, Any]:
    """Only the metadata of the ``chakra-json`` file at ``path``."""
    doc = _document(_text(path), str(path))
    return metadata(_parse(doc.get("metadata", {}), schema.GlobalMetadata(), str(path)))


def read(directory: Path) -> TraceSet:
    """The ``chakra-json`` backend's reader: a directory of ``<prefix>.<rank>.json`` files."""
    return traceset.open_set(Path(directory), "json", read_json_file, read_json_header,
                             FORMAT_ID)


def detect(directory: Path) -> bool:
    """Whether ``directory`` holds ``chakra-json`` files."""
    return traceset.detect(Path(directory), "json")
