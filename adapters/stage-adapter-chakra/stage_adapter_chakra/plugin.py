"""STAGE plugin: registers the ``chakra`` and ``chakra-json`` trace backends."""

from __future__ import annotations

from stage_core import hookimpl
from stage_core.records import BackendSpec

from . import et, etread, jsonread, jsontrace


@hookimpl
def stage_trace_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="chakra",
            write=et.write,
            read=etread.read,
            detect=etread.detect,
            format_id=et.FORMAT_ID,
            description="Chakra ET v0.0.4 protobuf, trace.<rank>.et (ASTRA-sim's input)",
        ),
        BackendSpec(
            name="chakra-json",
            write=jsontrace.write,
            read=jsonread.read,
            detect=jsonread.detect,
            format_id=jsontrace.FORMAT_ID,
            description="Chakra ET v0.0.4 in protobuf's JSON mapping, trace.<rank>.json",
        ),
    ]
