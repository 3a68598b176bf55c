"""Decode the Node records of a set's trace files, each distinct record once.

The ranks of a rank class are stamped from one program (:mod:`.stamp`): their files
hold the same records in the same order, except the few nodes whose attributes
depend on the rank (a collective's ``pg_name``, a send's ``comm_dst``, a receive's
``comm_src``).  A :class:`NodeDecoder` reads the files of one set and uses that:

* Every distinct record is decoded once.  A record is looked up by its full bytes,
  and equal bytes decode to equal nodes, so the :class:`~stage_core.trace.TraceNode`
  decoded first is handed out again for every later copy (nodes are shared between
  files and never modified, as the TraceNode contract says).  A new record that is
  a record of the template (below) with one attribute entry replaced -- a
  collective naming another group, a send to another peer -- is decoded from the
  template's node and that entry alone (see :func:`_layout`), the entry parsed by
  protobuf once per distinct entry.

* Each class has a *template*: the last file read of the class, with its records'
  sizes and nodes.  A later file is compared with it, not split into records: the
  records between two records that differed the last time (*hot* ones: the peers
  of sends and receives, on most sets) form a run, and the decoder checks that the
  file continues with exactly the bytes of the run (one ``startswith`` in C), then
  takes the run's nodes.  A hot record is compared on its own.  Within a run that
  does not match, the records that ever differed before (*warm* ones: a group's
  collectives, whose pg_name changes only every few ranks) are compared one by one
  and the stretches between them in one piece; a stretch that does not match is
  bisected down to the record that differs.  A record that differs is looked up by
  its bytes; it must decode to the same node id, name and type as the template's
  (another rank's copy of the node), else the file is not of the template's class
  (it is tried with the other templates, or starts a template of its own).  The
  file then becomes the class's template.  Every byte of every file is thus either
  compared with the bytes a node was decoded from or decoded itself.

  The first record of a class may itself differ from rank to rank (a pipeline
  stage's first node receives from the previous stage), so a file is tried with
  every template: first those it looks like (:meth:`_Template.opens`), then the
  most recently used; a file of another class is told apart at its first record
  that decodes to another node.

Memory is bounded: at most ``MAX_CACHED_RECORDS`` decoded records (and as many
attribute entries), and ``MAX_TEMPLATES`` templates holding ``MAX_TEMPLATE_BYTES``
(forgetting them costs time, never correctness).
"""

from __future__ import annotations

from bisect import bisect_left
from heapq import merge
from itertools import accumulate
from operator import sub

from google.protobuf.message import DecodeError
from stage_core.api import TraceNode

from . import schema, wire
from .convert import LIST_KINDS, attr_value, trace_node

#: distinct records kept decoded; past this many the cache starts over
MAX_CACHED_RECORDS = 1 << 16
#: templates kept: one per rank class being read (the classes may interleave in rank
#: order, as pipeline stages do with a rank order that puts pp first)
MAX_TEMPLATES = 64
#: file bytes the templates may hold together (the newest is kept whatever its size)
MAX_TEMPLATE_BYTES = 1 << 28


class BadRecord(Exception):
    """A record that cannot be framed or decoded, at byte ``offset`` of its file."""

    def __init__(self, offset: int, error: Exception | str):
        super().__init__(f"record at byte {offset}: {error}")
        self.offset, self.error = offset, error


class _Template:
    """The last file read of a rank class: its records' sizes and nodes, cut in runs.

    ``hot``: the records whose bytes differed between this file and the one of the
    class read before it; the records between two hot ones form a run.  ``warm``:
    every record that differed between two files of the class so far.
    """

    __slots__ = ("view", "base", "sizes", "nodes", "warm", "layouts", "runs", "_starts")

    def __init__(self, data: bytes, base: int, sizes: list[int], nodes: list[TraceNode],
                 hot: list[int], warm: list[int], layouts: dict[int, tuple] | None = None):
        self.view = memoryview(data)  # the file, read-only: slices are not copies
        self.base = base  # offset of the first record's length prefix
        self.sizes = sizes  # sizes[i]: bytes of record i, its length prefix included
        self.nodes = nodes
        self.warm = warm  # sorted
        # record index -> (node, the _layout of its record), for the records compared
        # with another file's so far; an entry holds for nodes[index] only if it is
        # that very node (the record may have changed since)
        self.layouts = {} if layouts is None else layouts
        self._starts: list[int] | None = None
        # (first, stop, offset, length): records first..stop-1 lie at view[offset:]
        runs = []
        offset, first = base, 0
        for mark in hot:
            if mark > first:
                length = sum(sizes[first:mark])
                runs.append((first, mark, offset, length))
                offset += length
            offset += sizes[mark]
            first = mark + 1
        if first < len(sizes):
            runs.append((first, len(sizes), offset, sum(sizes[first:])))
        self.runs = runs

    @property
    def size(self) -> int:
        """Bytes of the file this template holds."""
        return len(self.view)

    def opens(self, data: bytes, pos: int) -> bool:
        """Whether ``data`` from ``pos`` on looks like a file of this class: after as
        many records as the class begins with that ever differed (a pipeline stage's
        first receive), it holds the bytes of the first record that never did.  Only
        orders the templates to try."""
        sizes, warm = self.sizes, self.warm
        anchor = 0
        while anchor < len(warm) and warm[anchor] == anchor:
            anchor += 1
        if anchor >= len(sizes) or anchor > 8:
            return False
        offset = self.base + sum(sizes[:anchor])
        end = len(data)
        for _ in range(anchor):  # skip the file's records, by their length prefixes
            if pos >= end:
                return False
            size = data[pos]
            if size < 0x80:
                pos += 1 + size
            elif pos + 1 < end and data[pos + 1] < 0x80:
                pos += 2 + ((size & 0x7F) | data[pos + 1] << 7)
            else:
                return False
        return data.startswith(self.view[offset:offset + sizes[anchor]], pos)

    def starts(self) -> list[int]:
        """Offset of each record, and the end of the last (made when first needed)."""
        if self._starts is None:
            self._starts = list(accumulate(self.sizes, initial=self.base))
        return self._starts


class NodeDecoder:
    """Decodes the Node records of the files of one trace set (see the module doc).

    ``read`` makes one per pass over a set; it holds no state beyond that pass.
    """

    def __init__(self, limit: int = MAX_CACHED_RECORDS, templates: int = MAX_TEMPLATES,
                 template_bytes: int = MAX_TEMPLATE_BYTES):
        self._nodes: dict[bytes, TraceNode] = {}
        self._limit = limit
        self._max_templates = templates
        self._max_bytes = template_bytes
        self._templates: list[_Template] = []  # most recently used first
        self._msg = schema.Node()
        self._attrs: dict[bytes, tuple] = {}  # attr entry bytes -> (name, (kind, value))
        self._attr_msg = schema.AttributeProto()

    def decode(self, data: bytes, pos: int = 0) -> list[TraceNode]:
        """The nodes of the records of ``data`` from byte ``pos`` on.

        Raises :class:`BadRecord` for a record that cannot be framed or decoded.
        """
        if len(self._nodes) > self._limit:
            self._nodes.clear()
        templates = self._templates
        for k in sorted(range(len(templates)), key=lambda k: not templates[k].opens(data, pos)):
            nodes = self._follow(k, data, pos)
            if nodes is not None:
                if k:
                    templates.insert(0, templates.pop(k))
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
        template = _Template(data, pos, list(map(sub, starts[1:], starts)), nodes, [], [])
        template._starts = starts
        templates = self._templates
        templates.insert(0, template)
        held = 0
        for k, kept in enumerate(templates):  # the newest is always kept
            held += kept.size
            if k and (k >= self._max_templates or held > self._max_bytes):
                del templates[k:]
                break
        return nodes

    # ------------------------------------------------------------- against a template

    def _follow(self, k: int, data: bytes, pos: int) -> list[TraceNode] | None:
        """The nodes of a file of the class of template ``k``; None if not of it.

        None as soon as the file is seen not to be of the class: a differing record
        that decodes to another node (not another rank's copy of the template's),
        or fewer or more records than the template has.  Otherwise the file becomes
        the class's template.
        """
        template = self._templates[k]
        view, known, sizes = template.view, template.nodes, template.sizes
        count, end, base = len(known), len(data), pos
        nodes: list[TraceNode] = []
        append = nodes.append
        differ: list[tuple[int, int]] = []  # (index, size) of records that differ
        i, ref = 0, template.base  # the next record; its offset in the template
        for first, stop, offset, length in (*template.runs, (count, count, 0, 0)):
            while i < first:  # a record that differed last time: compare it alone
                size = sizes[i]
                if data.startswith(view[ref:ref + size], pos):
                    append(known[i])
                    pos += size
                else:
                    node, after = self._changed(data, pos, template, i, ref, ref + size)
                    if node is None:
                        return None
                    append(node)
                    differ.append((i, after - pos))
                    pos = after
                ref += size
                i += 1
            if i == count:
                break
            if data.startswith(view[offset:offset + length], pos):  # the whole run
                nodes += known[first:stop]
                pos, i, ref = pos + length, stop, offset + length
                continue
            # the records of the run that differed before, one by one, and the
            # stretches between them in one piece
            starts = template.starts()
            warm = template.warm
            for mark in (*warm[bisect_left(warm, first):bisect_left(warm, stop)], stop):
                if i < mark:
                    if data.startswith(view[starts[i]:starts[mark]], pos):
                        nodes += known[i:mark]
                        pos += starts[mark] - starts[i]
                    else:
                        pos = self._bisect(template, i, mark, data, pos, nodes, differ)
                        if pos < 0:
                            return None
                    i = mark
                if mark == stop:
                    break
                if data.startswith(view[starts[i]:starts[i + 1]], pos):
                    append(known[i])
                    pos += starts[i + 1] - starts[i]
                else:
                    node, after = self._changed(data, pos, template, i, starts[i],
                                                starts[i + 1])
                    if node is None:
                        return None
                    append(node)
                    differ.append((i, after - pos))
                    pos = after
                i += 1
            ref = offset + length
        if pos != end:
            return None  # more records than the template
        for index, size in differ:
            sizes[index] = size
        hot = [index for index, _ in differ]
        warm = template.warm
        if hot:
            new = set(hot).difference(warm)
            if new:
                warm = list(merge(warm, sorted(new)))
        self._templates[k] = _Template(data, base, sizes, nodes, hot, warm, template.layouts)
        return nodes

    def _bisect(self, template: _Template, i: int, stop: int, data: bytes, pos: int,
                nodes: list[TraceNode], differ: list[tuple[int, int]]) -> int:
        """Records ``i..stop-1`` of the template, of which some differ in ``data``
        from ``pos`` on: their nodes go to ``nodes``; the offset after them, or -1
        if the file is not of the template's class."""
        view, known, starts = template.view, template.nodes, template.starts()
        rest = False  # whether records i..stop-1 may all be the same
        while i < stop:
            if rest and data.startswith(view[starts[i]:starts[stop]], pos):
                nodes += known[i:stop]
                return pos + starts[stop] - starts[i]
            low, high = i, stop  # records i..low-1 are the same, i..high-1 not all
            while high - low > 1:
                mid = (low + high) >> 1
                if data.startswith(view[starts[i]:starts[mid]], pos):
                    low = mid
                else:
                    high = mid
            nodes += known[i:low]
            pos += starts[low] - starts[i]
            node, after = self._changed(data, pos, template, low, starts[low],
                                        starts[low + 1])  # record low differs
            if node is None:
                return -1
            nodes.append(node)
            differ.append((low, after - pos))
            pos, i, rest = after, low + 1, True
        return pos

    def _changed(self, data: bytes, pos: int, template: _Template, index: int,
                 start: int, stop: int) -> tuple[TraceNode | None, int]:
        """The node of the record at ``pos``, which differs from record ``index`` of
        ``template`` (at ``start:stop``, length prefix included), and the offset after
        it; None if the file ends or the node is not another rank's copy of the
        template's."""
        if pos >= len(data):
            return None, pos
        twin = template.nodes[index]
        record, after = self._frame(data, pos)
        node = self._nodes.get(record)
        if node is None:
            node = self._derived(record, template, index, start, stop)
            if node is None:
                node = self._node(record, pos)
            else:
                self._nodes[record] = node
        if node.id != twin.id or node.name != twin.name or node.type != twin.type:
            return None, after  # another node, not another rank's copy of it
        return node, after

    def _derived(self, record: bytes, template: _Template, index: int, start: int,
                 stop: int) -> TraceNode | None:
        """The node of ``record`` when it is the record ``index`` of ``template``
        with one attribute entry replaced by another valid one (see :func:`_layout`);
        None otherwise."""
        twin, view, layouts = template.nodes[index], template.view, template.layouts
        got = layouts.get(index)
        if got is None or got[0] is not twin:
            while view[start] >= 0x80:  # past the length prefix
                start += 1
            got = layouts[index] = (twin, _layout(view[start + 1:stop], twin))
        layout = got[1]
        if layout is None:
            return None
        bounds, attr_at, low = layout
        size = bounds[-1]
        body = view[stop - size:stop]
        # the entry that differed last time at this index, else the one that holds the
        # first byte that differs (record starts with body[:bounds[low]], not high)
        if low < 0 or not record.startswith(body[:bounds[low]]):
            low, high = 0, len(bounds) - 1
            if record.startswith(body):
                return None  # (longer than twin's)
            while high - low > 1:
                mid = (low + high) >> 1
                if record.startswith(body[:bounds[mid]]):
                    low = mid
                else:
                    high = mid
        k = attr_at.get(low)
        if k is None:
            return None
        first, after = bounds[low], bounds[low + 1]
        last = len(record) - (size - after)  # where the rest of twin's record begins
        if last - first < 3 or not record.endswith(body[after:]):
            return None
        # record[first:last] must be one attr entry: key 0x52 (field 10, length-
        # delimited), its length in one or two bytes, then exactly that many bytes
        if record[first] != 0x52:
            return None
        length, head = record[first + 1], first + 2
        if length >= 0x80:
            if record[head] >= 0x80:
                return None
            length, head = (length & 0x7F) | record[head] << 7, head + 1
        if head + length != last:
            return None
        entry = self._attr(record[head:last])
        if entry is None:
            return None
        items = list(twin.attrs.items())  # (one per entry: see _layout)
        items[k] = entry
        attrs = dict(items)
        layout = None
        if len(attrs) < len(items):  # a repeated name keeps its first entry
            attrs = {}
            for name, value in items:
                attrs.setdefault(name, value)
        else:  # the new record's layout: entry ``low`` is ``last - after`` longer
            change = last - after
            if change:
                bounds = bounds[:low + 1] + [bound + change for bound in bounds[low + 1:]]
            layout = (bounds, attr_at, low)
        node = TraceNode(twin.id, twin.name, twin.type, twin.data_deps, twin.ctrl_deps, attrs,
                         twin.duration_micros)
        layouts[index] = (node, layout)  # for the next file, if this one is of the class
        return node

    def _attr(self, payload: bytes) -> tuple[str, tuple] | None:
        """``(name, (kind, value))`` of an AttributeProto's bytes; None if invalid."""
        entry = self._attrs.get(payload)
        if entry is None:
            msg = self._attr_msg
            try:
                msg.ParseFromString(payload)
            except DecodeError:
                return None
            kind, value = attr_value(msg)
            entry = (msg.name, (kind, value))
            if kind not in LIST_KINDS:  # (a list is mutable: each node its own)
                if len(self._attrs) > self._limit:
                    self._attrs.clear()
                self._attrs[payload] = entry
        return entry

    @staticmethod
    def _frame(data: bytes, pos: int) -> tuple[bytes, int]:
        try:
            return wire.read_frame(data, pos)
        except wire.FrameError as exc:
            raise BadRecord(exc.offset, exc.reason) from None


def _layout(body: memoryview, node: TraceNode) -> tuple[list[int], dict[int, int], int] | None:
    """Where the top-level fields of a valid Node record ``body`` (decoded to
    ``node``) begin and end, and which of them are attribute entries.

    ``(bounds, attr_at, -1)``: field ``j`` is ``body[bounds[j]:bounds[j + 1]]``;
    ``attr_at[j] = k`` when field ``j`` is the ``k``-th attribute entry (field 10,
    length-delimited), i.e. ``list(node.attrs.items())[k]``; the last item is the
    field that a record derived from this one differed in (-1: none yet).  None for
    a record this does not cover: a group, field 10 of another wire type, or a
    repeated attribute name (``node.attrs`` would not list every entry).

    The record is valid (protobuf parsed it), so its framing is the one protobuf
    read, field by field: a record that is ``body`` with one attribute entry
    replaced by one valid entry is a valid Node, which protobuf decodes as ``node``
    with that one element of ``attr`` replaced (the other fields are the same bytes
    in the same order), and :meth:`NodeDecoder._derived` builds exactly that node.
    """
    bounds, attr_at = [0], {}
    pos, end = 0, len(body)
    try:
        while pos < end:
            key, pos = _varint(body, pos)
            wire_type = key & 7
            if wire_type == 0:
                _, pos = _varint(body, pos)
            elif wire_type == 2:
                size, pos = _varint(body, pos)
                pos += size
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            else:
                return None
            if key >> 3 == 10:
                if wire_type != 2:
                    return None
                attr_at[len(bounds) - 1] = len(attr_at)
            bounds.append(pos)
    except IndexError:
        return None
    if pos != end or len(attr_at) != len(node.attrs):
        return None
    return bounds, attr_at, -1


def _varint(body: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` of a valid record, and the position after it."""
    value = shift = 0
    while True:
        byte = body[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
