"""Read a large set with several processes.

Worker processes read the files and match each against their templates
(:class:`~.stampread.StampDecoder`); for a file read as a template's with some
values replaced, they send back only which template (the file it was made from)
and the values.  This process decodes each template file once itself and hands out
the rank's nodes as :class:`~stage_core.trace.StampedNodes` over it; every other
file (one per class in each worker, and any file a worker could not read so) it
decodes itself, so that its errors are reported as usual.  A template file decoded
so is the base of the files read from it; when this process itself read that file
as another template's with values replaced, the values of the files read from it
are composed with those, so that a class has one base whatever the number of
workers (the checks that work per node list do so once).
"""

from __future__ import annotations

import multiprocessing
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Sequence

from stage_core.api import StampedNodes, TraceNode

from .records import NodeDecoder
from .stampread import StampDecoder

#: files per task of a worker
CHUNK = 32
#: bases (decoded template files) kept at once
MAX_BASES = 64

_DECODER: StampDecoder | None = None  # each worker's


def _start_worker() -> None:
    global _DECODER
    from .writer import _worker_signals

    _worker_signals()
    _DECODER = StampDecoder()


def _match(paths: list[str]) -> list[tuple[dict, tuple[str, dict]] | None]:
    from .etread import read_et_file

    out = []
    for path in paths:
        try:
            meta, _ = read_et_file(Path(path), _DECODER)
        except Exception:  # noqa: BLE001 - this process decodes it again and reports
            out.append(None)
            continue
        out.append(None if _DECODER.last is None or not meta["version"] else (meta, _DECODER.last))
    return out


def _nodes(path: str) -> list[TraceNode]:
    from .etread import read_et_file

    return read_et_file(Path(path), NodeDecoder())[1]


def read_files(paths: Sequence[Path], workers: int) -> Iterator[tuple[dict[str, Any], Sequence[TraceNode]]]:
    """``(metadata, nodes)`` of each file of ``paths``, in order (see the module doc)."""
    from .etread import read_et_file

    mine = StampDecoder()
    bases: dict[str, list[TraceNode]] = {}
    aliases: dict[str, StampedNodes] = {}  # a worker's template file, as read here
    chunks = [[str(p) for p in paths[i:i + CHUNK]] for i in range(0, len(paths), CHUNK)]
    with multiprocessing.get_context("fork").Pool(workers, initializer=_start_worker) as pool:
        for chunk, results in zip(chunks, pool.imap(_match, chunks)):
            for path, got in zip(chunk, results):
                if got is None:  # (usually a worker's template: later files refer to it)
                    meta, nodes = read_et_file(Path(path), mine)
                    if type(nodes) is list:
                        _keep(bases, path, nodes)
                    elif isinstance(nodes, StampedNodes):
                        _keep(aliases, path, nodes)
                    yield meta, nodes
                    continue
                meta, (source, values) = got
                base = bases.get(source)
                if base is None:
                    alias = aliases.get(source)
                    if alias is not None:
                        base, values = alias.base, composed(alias.values, values)
                    else:
                        base = _keep(bases, source, _nodes(source))
                yield meta, StampedNodes(base, values, partial(_nodes, path))


def composed(first: dict, then: dict) -> dict:
    """The values of a file read as a template ``b`` with ``then`` replaced, where ``b``
    was read as a template ``a`` with ``first`` replaced: the file as ``a`` with the
    result replaced (see :class:`~stage_core.trace.StampedNodes`)."""
    out = {}
    for (name, old), mid in first.items():
        new = then.get((name, mid), mid)
        if new != old:
            out[(name, old)] = new
    for key, new in then.items():
        if key not in first and new != key[1]:
            out[key] = new
    return out


def _keep(bases: dict, path: str, nodes):
    if len(bases) >= MAX_BASES:
        bases.clear()
    bases[path] = nodes
    return nodes
