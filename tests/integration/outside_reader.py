"""mlcommons/chakra's own reader against STAGE's, node by node.

The wheel of mlcommons/chakra (../shared/wheels) is installed in tox's integration
environment when ``STAGE_CHAKRA_WHEEL`` is set (CI sets it); its ``decodeMessage``
reads a trace file the way Chakra's own tools do.
"""

from __future__ import annotations

from pathlib import Path

NO_CHAKRA = ("mlcommons/chakra is not installed (pip install --no-deps "
             "../shared/wheels/chakra-1.0.0-py3-none-any.whl protobuf; tox's integration "
             "environment does when STAGE_CHAKRA_WHEEL is set)")


def chakra_reader():
    """(et_def_pb2, decodeMessage, openFileRd) of mlcommons/chakra, None when absent."""
    try:
        from chakra.schema.protobuf import et_def_pb2
        from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd
    except ImportError:
        return None
    return et_def_pb2, decodeMessage, openFileRd


def decoded_by_chakra(path: Path, reader) -> tuple[str, list]:
    """The version of the file's GlobalMetadata and its Node messages, as Chakra reads them."""
    et_def_pb2, decode, open_file = reader
    handle = open_file(str(path))
    try:
        meta = et_def_pb2.GlobalMetadata()
        assert decode(handle, meta), f"{path}: no GlobalMetadata"
        nodes = []
        while True:
            node = et_def_pb2.Node()
            if not decode(handle, node):
                return meta.version, nodes
            nodes.append(node)
    finally:
        handle.close()


def compare_with_chakra(host, trace_dir: Path, reader) -> int:
    """Assert that Chakra decodes every node of every rank of ``trace_dir`` as STAGE's
    reader does (id, name, type, dependencies, every attribute's oneof and value,
    duration); the number of nodes compared."""
    from stage_core.flow import read_trace_set

    compared = 0
    trace_set = read_trace_set(host, Path(trace_dir))
    for rank, ours in trace_set.iter_ranks():
        path = Path(trace_dir) / f"trace.{rank}.et"
        version, theirs = decoded_by_chakra(path, reader)
        assert version == trace_set.metadata.get("version", "0.0.4") == "0.0.4", path
        assert len(theirs) == len(ours), f"{path}: Chakra reads {len(theirs)} nodes, STAGE {len(ours)}"
        for mine, node in zip(ours, theirs):
            attrs = {}
            for attr in node.attr:
                kind = attr.WhichOneof("value")
                attrs[attr.name] = (kind, getattr(attr, kind))
            assert (node.id, node.name, node.type, list(node.data_deps), list(node.ctrl_deps),
                    attrs, node.duration_micros) == \
                (mine.id, mine.name, mine.type, list(mine.data_deps), list(mine.ctrl_deps),
                 dict(mine.attrs), mine.duration_micros), f"{path}: node {mine.id} differs"
        compared += len(theirs)
    return compared
