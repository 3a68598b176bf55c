"""Read the files of a rank class as one template and, per file, a few substitutions.

The ranks of a class hold the same records except for the attribute entries whose
value depends on the rank (:data:`RANK_ATTRS`: a collective's ``pg_name``, a send's
``comm_dst``, a receive's ``comm_src``), and in a STAGE set each file names one
value per such entry *of the template*: every collective that names the template's
tp group names the file's tp group.  A :class:`StampDecoder` uses that:

* The first file of a class is decoded by :class:`~.records.NodeDecoder` and becomes a
  *template*: its bytes as fixed pieces around the occurrences of its distinct
  rank-dependent entries (the inverse of the writer's :mod:`.stamp`), each record's
  length prefix recomputed from the lengths of the entries it holds.
* A later file is read as the template with each distinct entry ``e`` replaced by
  an entry ``s(e)``: ``s`` is read at the first occurrence of each ``e`` only (where
  it must sit, given the lengths of the entries before it), then the file the
  template and ``s`` make is built in one join and compared with the file, byte for
  byte.  Every byte of the file is thus compared with a template byte or with an
  entry that was parsed (protobuf, once per distinct entry).
* The file's nodes are the template's with those values replaced: a
  :class:`~stage_core.trace.StampedNodes` (the template's node list and the values,
  which a checker may use as they are), when each replaced entry is the same
  attribute with another value.  Its nodes, when asked for, are the template's with
  the node of each record holding a replaced entry derived once per distinct
  (record, entry) and shared afterwards, a few array operations per distinct entry.

A file that is not the template of any class so read (another class, or a file
that differs elsewhere) goes to the :class:`~.records.NodeDecoder`, whose result may
become a template in turn.  Memory is bounded like the NodeDecoder's.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from stage_core.api import RANK_ATTRS, StampedNodes, TraceNode

from . import schema, wire
from .convert import LIST_KINDS, attr_value
from .records import NodeDecoder, _layout
from .stamp import Stamp, Record, merge_runs

#: templates kept (one per class being read) and the file bytes they may hold
MAX_TEMPLATES = 64
MAX_TEMPLATE_BYTES = 1 << 28
#: distinct entries and derived nodes kept; past this many the caches start over
MAX_CACHED = 1 << 16

_ATTR_KEY = 0x52  # Node field 10 (attr), length-delimited


class _Template:
    """A file of a class: fixed pieces around its rank-dependent entries."""

    __slots__ = ("stamp", "entries", "names", "first", "before", "nodes", "array", "single",
                 "multi", "cum", "size", "head", "derived", "source")

    def __init__(self, stamp: Stamp, entries: tuple[bytes, ...], names: list[str],
                 occurrences: list[int], nodes: list[TraceNode], record_of: list[int], size: int,
                 head: bytes):
        self.stamp = stamp
        self.entries = entries  # distinct entries, in first-occurrence order
        self.names = names  # the attribute name of each
        self.nodes = nodes
        self.array = np.empty(len(nodes), dtype=object)
        self.array[:] = nodes
        self.size = size
        self.head = head  # the bytes before the first record holding an entry
        # first[k]: index (among occurrences) of entry k's first occurrence;
        # before[k][j]: occurrences of entry j before it
        self.first, self.before = [], []
        seen = [0] * len(entries)
        for i, k in enumerate(occurrences):
            if k == len(self.first):
                self.first.append(i)
                self.before.append(seen[:k])
            seen[k] += 1
        # records holding one entry, by entry: (record indices); others: record -> entries
        by_record: dict[int, list[int]] = {}
        for k, record in zip(occurrences, record_of):
            by_record.setdefault(record, []).append(k)
        single: dict[int, list[int]] = {}
        self.multi: dict[int, tuple[int, ...]] = {}
        for record, ks in by_record.items():
            if len(ks) == 1:
                single.setdefault(ks[0], []).append(record)
            else:
                self.multi[record] = tuple(ks)
        self.single = {k: np.asarray(records) for k, records in single.items()}
        self.cum: dict[tuple[int, ...], list[int]] = {}  # lengths -> fixed pieces' offsets
        self.derived: dict[tuple[int, bytes], Any] = {}  # (entry k, its bytes) -> node(s)
        self.source: Any = None  # what the template's file was called

    def offsets(self, lengths: tuple[int, ...]) -> list[int]:
        got = self.cum.get(lengths)
        if got is None:
            got = list(accumulate(map(len, self.stamp.pieces(lengths)), initial=0))
            if len(self.cum) < 256:
                self.cum[lengths] = got
        return got


class StampDecoder:
    """Decodes the Node records of the files of one set (see the module doc)."""

    def __init__(self):
        #: after decode: (source of the template, values replaced) when the file was
        #: read as a template's with values replaced, else None
        self.last: tuple[Any, dict] | None = None
        self.fallback = NodeDecoder()
        self._templates: list[_Template] = []  # most recently used first
        self._entries: dict[bytes, tuple[str, tuple] | None] = {}
        self._msg = schema.AttributeProto()

    def decode(self, data: bytes, pos: int = 0, source: Any = None) -> list[TraceNode]:
        """The nodes of the records of ``data`` from byte ``pos`` on (see
        :meth:`.records.NodeDecoder.decode`, whose errors it raises).  ``source``
        names the file, for :meth:`last`."""
        self.last = None
        templates = self._templates
        for k, template in enumerate(templates):
            if not data.startswith(template.head):
                continue
            nodes = self._follow(template, data)
            if nodes is not None:
                if k:
                    templates.insert(0, templates.pop(k))
                if isinstance(nodes, StampedNodes):
                    self.last = (template.source, nodes.values)
                return nodes
        nodes = self.fallback.decode(data, pos)
        template = _template(data, pos, nodes)
        if template is not None:
            template.source = source
        if template is not None:
            templates.insert(0, template)
            held = 0
            for k, kept in enumerate(templates):
                held += kept.size
                if k and (k >= MAX_TEMPLATES or held > MAX_TEMPLATE_BYTES):
                    del templates[k:]
                    break
        return nodes

    # ------------------------------------------------------------- a file of a template

    def _follow(self, template: _Template, data: bytes) -> list[TraceNode] | None:
        entries, count = template.entries, len(template.entries)
        if not count:
            return template.nodes if data == template.stamp.file(()) else None
        values: list[bytes] = list(entries)
        lengths = list(map(len, entries))
        end = len(data)
        for k in range(count):
            cum = template.offsets(tuple(lengths))
            first = template.first[k]
            at = cum[first + 1] + sum(n * lengths[j] for j, n in enumerate(template.before[k]))
            # an attr entry: key, length (one or two bytes), payload
            if at + 2 > end or data[at] != _ATTR_KEY:
                return None
            size, head = data[at + 1], at + 2
            if size >= 0x80:
                if head >= end or data[head] >= 0x80:
                    return None
                size, head = (size & 0x7F) | data[head] << 7, head + 1
            if head + size > end:
                return None
            values[k] = data[at:head + size]
            lengths[k] = len(values[k])
        if template.stamp.file(tuple(values)) != data:
            return None
        changes = [(self._entry(entries[k]), self._entry(value))
                   for k, value in enumerate(values) if value != entries[k]]
        if not changes:
            return template.nodes
        if any(new is None for _, new in changes):
            return None  # (the full decode names the broken entry)
        replaced: dict[tuple[str, Any], Any] = {}
        for (name, (kind, old)), (new_name, (new_kind, new)) in changes:
            if (new_name, new_kind) != (name, kind) or replaced.setdefault((name, old), new) != new:
                return self._nodes(template, values)  # not a change of value alone
        return StampedNodes(template.nodes, replaced, lambda: self._nodes(template, values))

    def _nodes(self, template: _Template, values: list[bytes]) -> list[TraceNode]:
        array = template.array.copy()
        derived = template.derived
        if len(derived) > MAX_CACHED:
            derived.clear()
        for k, value in enumerate(values):
            records = template.single.get(k)
            if records is None or value == template.entries[k]:
                continue
            nodes = derived.get((k, value))
            if nodes is None:
                entry = self._entry(value)
                nodes = derived[(k, value)] = np.empty(len(records), dtype=object)
                nodes[:] = [_replaced(template.nodes[r], template.names[k], entry) for r in records]
            array[records] = nodes
        for record, ks in template.multi.items():
            node = template.nodes[record]
            for k in ks:
                if values[k] != template.entries[k]:
                    node = _replaced(node, template.names[k], self._entry(values[k]))
            array[record] = node
        return array.tolist()

    def _entry(self, entry: bytes) -> tuple[str, tuple] | None:
        """``(name, (kind, value))`` of an attr entry (key and length included)."""
        got = self._entries.get(entry, False)
        if got is False:
            head = 3 if entry[1] >= 0x80 else 2
            msg = self._msg
            try:
                msg.ParseFromString(entry[head:])
            except DecodeError:
                got = None
            else:
                kind, value = attr_value(msg)
                got = None if kind in LIST_KINDS else (msg.name, (kind, value))
            if len(self._entries) > MAX_CACHED:
                self._entries.clear()
            self._entries[entry] = got
        return got


def _replaced(node: TraceNode, old: str, entry: tuple[str, tuple]) -> TraceNode:
    """``node`` with its attribute ``old`` replaced, in place, by ``entry``
    (``(name, (kind, value))``); a repeated name keeps its first, as protobuf's."""
    attrs: dict[str, tuple] = {}
    for name, value in node.attrs.items():
        if name == old:
            name, value = entry
        attrs.setdefault(name, value)
    return TraceNode(node.id, node.name, node.type, node.data_deps, node.ctrl_deps, attrs,
                     node.duration_micros)


def _template(data: bytes, pos: int, nodes: list[TraceNode]) -> _Template | None:
    """``data`` (decoded to ``nodes``) as a template; None when a record holding a
    rank-dependent entry is not one :func:`.records._layout` covers."""
    records, starts = wire.split_frames(data, pos)
    runs: list[Any] = [data[:pos]]
    entries: dict[bytes, int] = {}
    names: list[str] = []
    occurrences, record_of = [], []
    head = None
    for index, (record, node) in enumerate(zip(records, nodes)):
        if not RANK_ATTRS.intersection(node.attrs):
            runs.append(data[starts[index]:starts[index + 1]])
            continue
        layout = _layout(memoryview(record), node)
        if layout is None:
            return None
        bounds, attr_at, _ = layout
        names_of = list(node.attrs)
        statics, used, last = [], [], 0
        for field, k in sorted(attr_at.items()):
            if names_of[k] not in RANK_ATTRS:
                continue
            entry = record[bounds[field]:bounds[field + 1]]
            statics.append(record[last:bounds[field]])
            if entry not in entries:
                entries[entry] = len(entries)
                names.append(names_of[k])
            used.append(entries[entry])
            occurrences.append(used[-1])
            record_of.append(index)
            last = bounds[field + 1]
        statics.append(record[last:])
        if head is None:
            head = data[:starts[index]]
        runs.append(Record(tuple(statics), tuple(used), sum(map(len, statics))))
    stamp = Stamp(merge_runs(runs), tuple(entries), wire.varint)
    template = _Template(stamp, tuple(entries), names, occurrences, nodes, record_of, len(data),
                         data[:pos] if head is None else head)
    if stamp.file(tuple(entries)) != data:  # (the pieces must make the file again)
        return None
    return template
