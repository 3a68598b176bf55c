"""Decode the Node records of a set's trace files, each distinct record once.

The ranks of a rank class are stamped from one program (:mod:`.stamp`): their files
hold the same records in the same order, except the few nodes whose attributes
depend on the rank (a collective's ``pg_name``, a send's ``comm_dst``, a receive's
``comm_src``).  A :class:`NodeDecoder` reads the files of one set and uses that:

* Every distinct record is decoded once.  A record is looked up by its full bytes,
  and equal bytes decode to equal nodes, so the :class:`~stage_core.trace.TraceNode`
  decoded first is handed out again for every later copy (nodes are shared between
  files and never modified, as the TraceNode contract says).

* The first file of a class becomes a *template*: its records, their nodes, and
  which records were seen to differ in later files of the class.  The records
  between two such variable records form a run; for a later file the decoder checks
  that the file continues with exactly the bytes of the run (one ``startswith`` in
  C) and then takes the run's nodes without splitting it into records again.  A run
  that does not match is split and looked up record by record; a record that
  differs becomes variable if it decodes to the same node id, name and type (a copy
  of the node for another rank), else the file is not of the template's class and
  starts a template of its own.  Every byte of every file is thus either compared
  with the bytes a node was decoded from or decoded itself.

Memory is bounded: at most ``MAX_CACHED_RECORDS`` decoded records and
``MAX_TEMPLATES`` templates (forgetting them costs time, never correctness).
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from stage_core.trace import TraceNode

from . import schema, wire
from .convert import trace_node

#: distinct records kept decoded; past this many the cache starts over
MAX_CACHED_RECORDS = 1 << 16
#: templates kept (about one per rank class being read)
MAX_TEMPLATES = 4


class BadRecord(Exception):
    """A record that cannot be framed or decoded, at byte ``offset`` of its file."""

    def __init__(self, offset: int, error: Exception | str):
        super().__init__(f"record at byte {offset}: {error}")
        self.offset, self.error = offset, error


class _Template:
    """A file's records and nodes, with runs of records no later file changed."""

    __slots__ = ("view", "starts", "nodes", "variable", "runs", "head", "tail")

    def __init__(self, data: bytes, starts: list[int], nodes: list[TraceNode]):
        self.view = memoryview(data)  # the file, read-only: slices are not copies
        self.starts = starts  # starts[i]: offset of record i's length prefix; + the end
        self.nodes = nodes
        self.variable = bytearray(len(nodes))  # 1: some file had other bytes here
        self.runs: list[tuple[int, int, memoryview]] = []
        self.head = self.tail = self.view[:0]
        self._cut()

    def framed(self, first: int, stop: int) -> memoryview:
        """Records ``first`` to ``stop`` (excluded), length prefixes included."""
        return self.view[self.starts[first]:self.starts[stop]]

    def _cut(self) -> None:
        """Runs ``(first, stop, framed bytes)`` of consecutive non-variable records."""
        runs = []
        first = None
        for i, var in enumerate(self.variable):
            if var:
                if first is not None:
                    runs.append((first, i, self.framed(first, i)))
                    first = None
            elif first is None:
                first = i
        count = len(self.nodes)
        if first is not None:
            runs.append((first, count, self.framed(first, count)))
        self.runs = runs
        # a file of this class starts and ends with the template's first and last
        # records, unless some file had other bytes there
        empty = self.view[:0]
        self.head = self.framed(0, 1) if count and not self.variable[0] else empty
        self.tail = self.framed(count - 1, count) if count and not self.variable[-1] else empty

    def fits(self, data: bytes, pos: int) -> bool:
        if not self.nodes:
            return pos == len(data)
        return data.startswith(self.head, pos) and data.endswith(self.tail)

    def mark(self, differ: list[int]) -> None:
        for i in differ:
            self.variable[i] = 1
        self._cut()


class NodeDecoder:
    """Decodes the Node records of the files of one trace set (see the module doc).

    ``read`` makes one per pass over a set; it holds no state beyond that pass.
    """

    def __init__(self, limit: int = MAX_CACHED_RECORDS, templates: int = MAX_TEMPLATES):
        self._nodes: dict[bytes, TraceNode] = {}
        self._limit = limit
        self._max_templates = templates
        self._templates: list[_Template] = []  # most recently used first
        self._msg = schema.Node()

    def decode(self, data: bytes, pos: int = 0) -> list[TraceNode]:
        """The nodes of the records of ``data`` from byte ``pos`` on.

        Raises :class:`BadRecord` for a record that cannot be framed or decoded.
        """
        if len(self._nodes) > self._limit:
            self._nodes.clear()
        for template in self._templates:
            if template.fits(data, pos):
                nodes = self._follow(template, data, pos)
                if nodes is not None:
                    self._templates.remove(template)
                    self._templates.insert(0, template)
                    return nodes
        return self._fresh(data, pos)

    # ------------------------------------------------------------- record by record

    def _node(self, record: bytes, offset: int) -> TraceNode:
        node = self._nodes.get(record)
        if node is None:
            msg = self._msg
            try:
                msg.ParseFromString(record)
                node = trace_node(msg)
            except (DecodeError, ValueError) as exc:
                raise BadRecord(offset, exc) from exc
            self._nodes[record] = node
        return node

    def _fresh(self, data: bytes, pos: int) -> list[TraceNode]:
        """Split and look up every record; the file becomes a template."""
        try:
            records, starts = wire.split_frames(data, pos)
        except wire.FrameError as exc:
            raise BadRecord(exc.offset, exc.reason) from None
        nodes = list(map(self._nodes.get, records))
        for i in [i for i, node in enumerate(nodes) if node is None]:
            nodes[i] = self._node(records[i], starts[i])
        self._templates.insert(0, _Template(data, starts, nodes))
        del self._templates[self._max_templates:]
        return nodes

    def _follow(self, template: _Template, data: bytes, pos: int) -> list[TraceNode] | None:
        """The nodes of a file of ``template``'s class; None if it is not of it."""
        nodes: list[TraceNode] = []
        append = nodes.append
        cached = self._nodes.get
        known = template.nodes
        count, end = len(known), len(data)
        differ: list[int] = []  # records of the template this file changes
        i = 0  # index of the next record, in the file and in the template
        for first, stop, run in (*template.runs, (count, count, None)):
            while i < first and pos < end:  # a variable record: look it up
                size = data[pos]  # (wire.read_frame, inlined for one- and two-byte
                body = pos + 1  # length prefixes: this loop runs once per comm node)
                if size >= 0x80:
                    if body < end and data[body] < 0x80:
                        size = (size & 0x7F) | data[body] << 7
                        body += 1
                    else:
                        size = end  # longer prefix: let read_frame decode it
                if body + size > end:
                    record, after = self._frame(data, pos)  # or raise BadRecord
                else:
                    after = body + size
                    record = data[body:after]
                node = cached(record)
                append(self._node(record, pos) if node is None else node)
                pos, i = after, i + 1
            if run is None or pos >= end:
                break
            if data.startswith(run, pos):  # the whole run, byte for byte
                nodes += known[first:stop]
                pos, i = pos + len(run), stop
                continue
            while i < stop and pos < end:  # which records of the run differ
                if data.startswith(template.framed(i, i + 1), pos):
                    append(known[i])
                    pos += template.starts[i + 1] - template.starts[i]
                else:
                    record, after = self._frame(data, pos)
                    node, twin = self._node(record, pos), known[i]
                    if node.id != twin.id or node.name != twin.name or node.type != twin.type:
                        return None  # another node, not another rank's copy of it
                    append(node)
                    differ.append(i)
                    pos = after
                i += 1
        while pos < end:  # more records than the template has
            record, after = self._frame(data, pos)
            append(self._node(record, pos))
            pos, i = after, i + 1
        if i != count:
            return None  # not the template's class: _fresh makes the file a template
        if differ:
            template.mark(differ)
        return nodes

    @staticmethod
    def _frame(data: bytes, pos: int) -> tuple[bytes, int]:
        try:
            return wire.read_frame(data, pos)
        except wire.FrameError as exc:
            raise BadRecord(exc.offset, exc.reason) from None
