"""A STAGE set's manifest.json against its files (when the reader found a manifest).

The manifest says what the set holds: the world size, the rank classes (which ranks
run one program), and per rank class what each of its ranks does in a step.  Every
one of those numbers is recomputed from the files and compared:

* ``world_size`` with the set's; the classes' ``ranks`` cover the world once each;
* per rank, from its nodes: ``nodes`` (a rank whose last nodes are missing has fewer:
  the end of its program is known from its class), the bytes of each collective type,
  of sends and of receives (``comm_bytes``), what those put on the rank's link by the
  ring algorithm on each group's size in comm_groups.json (``wire_bytes``, when the
  manifest has it), the FLOPs (``flops``: the compute nodes'
  num_ops, where a kernel without arithmetic is written as 1), the kernels' bytes
  (``kernel_bytes``: tensor_size, likewise), the compute time (``compute_time_us``:
  duration_micros, when the set was timed), and no node is a CPU op;
* each rank's program: ``program_sha256`` (a set written with validation has it for
  every class whose ranks run one program)
  digests every node's id, name, type, dependencies, duration and attributes (name,
  kind, value), all but the values that differ between the ranks of a class (pg_name,
  comm_src, comm_dst, which the group and pair checks follow), as the set was read back
  and validated when it was written; so any change of a node is seen;
* the ranks of a class have the same costs.
"""

from __future__ import annotations

import hashlib
from operator import is_
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..hardware import wire_bytes
from ..trace import COMM_KEYS, RANK_ATTRS, NodeType, StampedNodes, TraceNode
from .problems import Problems

#: manifest key -> what the files must add up to
COMM_FIELDS = (*COMM_KEYS.values(), "send", "recv")
_MAX_MEMO = 64


@dataclass(frozen=True, slots=True)
class Costs:
    """What one rank's nodes add up to (the numbers a manifest states of its class)."""

    nodes: int
    num_ops: int  # as written
    unit_ops: int  # compute nodes written with num_ops 1 (a kernel without arithmetic is)
    tensor_size: int
    unit_bytes: int  # compute nodes written with tensor_size 1
    comm: tuple[tuple[str, int], ...]  # (manifest key, bytes), in COMM_FIELDS order
    wire: tuple[tuple[str, int], ...]  # the same on the wire (hardware.wire_bytes)
    micros: int
    cpu_ops: int
    program: str = field(compare=False)  # program_digest of the nodes (checked on its own)


class CostMemo:
    """Costs of each rank; a node list shared by several ranks (a reader's StampedNodes
    base: only pg_name and peers differ, which no cost reads) is added up once, also
    when a rank had it as its own nodes before (a reader's first file of a class)."""

    def __init__(self, group_sizes: Mapping[str, int] | None = None):
        # id(list) -> (the list, or a copy of a rank's own list, and its costs)
        self._by_base: dict[int, tuple[Sequence[TraceNode], Costs]] = {}
        self.group_sizes = dict(group_sizes or {})  # pg_name -> ranks (a class's ranks' groups are alike)

    def costs(self, nodes: Sequence[TraceNode]) -> Costs:
        if not isinstance(nodes, StampedNodes):
            # (a rank's own list might be changed afterwards by whoever made it: keep a copy)
            return self._keep(nodes, tuple(nodes), _add_up(nodes, self.group_sizes))
        base = nodes.base
        got = self._by_base.get(id(base))
        if got is not None and got[0] is base:
            return got[1]
        if got is not None and len(got[0]) == len(base) and all(map(is_, got[0], base)):
            return self._keep(base, base, got[1])
        return self._keep(base, base, _add_up(base, self.group_sizes))

    def _keep(self, nodes: Sequence[TraceNode], held: Sequence[TraceNode], costs: Costs) -> Costs:
        if len(self._by_base) >= _MAX_MEMO:
            self._by_base.clear()
        self._by_base[id(nodes)] = (held, costs)
        return costs


def _number(node: TraceNode, name: str) -> int:
    value = node.attr(name, 0)
    return value if type(value) is int else 0  # (a value of another type: the structure checks say so)


def _add_up(nodes: Sequence[TraceNode], group_sizes: Mapping[str, int] | None = None) -> Costs:
    num_ops = unit_ops = tensor_size = unit_bytes = micros = cpu_ops = 0
    comm = dict.fromkeys(COMM_FIELDS, 0)
    wire = dict.fromkeys(COMM_FIELDS, 0)
    sizes = group_sizes or {}
    for node in nodes:
        kind = node.type
        if node.attr("is_cpu_op") is True:
            cpu_ops += 1
        if kind == NodeType.COMP:
            ops, size = _number(node, "num_ops"), _number(node, "tensor_size")
            num_ops += ops
            tensor_size += size
            unit_ops += ops == 1
            unit_bytes += size == 1
            micros += node.duration_micros or 0
        elif kind == NodeType.COMM_COLL:
            key = COMM_KEYS.get(_number(node, "comm_type"), None)
            if key is not None:
                size = _number(node, "comm_size")
                comm[key] += size
                wire[key] += wire_bytes(key, size, sizes.get(str(node.attr("pg_name")), 0))
        elif kind == NodeType.COMM_SEND:
            comm["send"] += _number(node, "comm_size")
            wire["send"] += _number(node, "comm_size")
        elif kind == NodeType.COMM_RECV:
            comm["recv"] += _number(node, "comm_size")
            wire["recv"] += _number(node, "comm_size")
    return Costs(len(nodes), num_ops, unit_ops, tensor_size, unit_bytes, tuple(comm.items()), tuple(wire.items()),
                 micros, cpu_ops, program_digest(nodes))


# --------------------------------------------------------------------------- program digests


def trace_node_key(node: TraceNode) -> tuple:
    """What the digest reads of a node: everything but the values of RANK_ATTRS (their
    names and kinds count), each attribute with its kind, in the file's order."""
    attrs = tuple((name, kind, None if name in RANK_ATTRS else value)
                  for name, (kind, value) in node.attrs.items())
    return (node.id, node.name, node.type, tuple(node.data_deps), tuple(node.ctrl_deps), node.duration_micros,
            attrs)


def program_digest(nodes: Iterable[TraceNode]) -> str:
    """SHA-256 of a rank's program up to its rank values (a manifest's ``program_sha256``)."""
    return hashlib.sha256("\n".join(map(repr, map(trace_node_key, nodes))).encode()).hexdigest()


def _is_int(value: Any) -> bool:
    return type(value) is int


def check_manifest(manifest: Any, world_size: int, present: Sequence[int], costs: Mapping[int, Costs],
                   out: Problems) -> None:
    """Compare ``manifest`` (the parsed manifest.json) with the ranks' ``costs``."""
    where = "manifest.json"
    if not isinstance(manifest, dict):
        out.at(None, None, "", f"{where} is not an object")
        return
    world = manifest.get("world_size")
    if world != world_size or not _is_int(world):
        out.at(None, None, "", f"{where}: world_size {world!r}, but the set has {world_size} ranks")
    classes = manifest.get("rank_classes")
    if not isinstance(classes, list) or not all(isinstance(c, dict) for c in classes):
        out.at(None, None, "", f"{where}: rank_classes is not a list of objects")
        return
    owner: dict[int, int] = {}
    for k, rc in enumerate(classes):
        ranks = rc.get("ranks")
        if not isinstance(ranks, list) or not all(map(_is_int, ranks)):
            out.at(None, None, "", f"{where}: rank class {k}: ranks is not a list of rank numbers")
            continue
        for rank in ranks:
            if rank in owner:
                out.at(rank, None, "", f"{where} lists this rank in rank classes {owner[rank]} and {k}")
            elif not 0 <= rank < world_size:
                out.at(None, None, "", f"{where}: rank class {k} lists rank {rank}, outside 0..{world_size - 1}")
            else:
                owner[rank] = k
    for rank in present:
        if rank not in owner:
            out.at(rank, None, "", f"{where} lists this rank in no rank class")
    timed = "hardware" in manifest
    for k, rc in enumerate(classes):
        mates = [r for r in rc.get("ranks") or () if _is_int(r) and owner.get(r) == k and r in costs]
        _check_class(k, rc, mates, costs, timed, out)


def _check_class(k: int, rc: dict, ranks: list[int], costs: Mapping[int, Costs], timed: bool,
                 out: Problems) -> None:
    where = f"manifest.json rank class {k}"
    # compute_time_us: every timed set's class has it; nodes and kernel_bytes every class
    # written since they exist (an older manifest has neither); none is ever null
    for key in ("nodes", "kernel_bytes", "compute_time_us"):
        if (key in rc or (key == "compute_time_us" and timed)) and not _is_int(rc.get(key)):
            out.at(None, None, "", f"{where}: {key} {rc.get(key, '(missing)')!r} is not an integer")
    if "program_sha256" in rc and not isinstance(rc["program_sha256"], str):
        out.at(None, None, "", f"{where}: program_sha256 {rc['program_sha256']!r} is not a digest")
    flops = rc.get("flops")
    if not isinstance(flops, dict) or not all(_is_int(flops.get(f)) for f in ("matmul", "other", "total")):
        out.at(None, None, "", f"{where}: flops must hold integers matmul, other and total")
        flops = None
    elif flops["matmul"] + flops["other"] != flops["total"]:
        out.at(None, None, "", f"{where}: flops total {flops['total']:,} is not matmul {flops['matmul']:,} "
                                f"+ other {flops['other']:,}")
    comm = rc.get("comm_bytes")
    if not isinstance(comm, dict) or not all(_is_int(comm.get(f)) for f in COMM_FIELDS):
        out.at(None, None, "", f"{where}: comm_bytes must hold an integer for each of {', '.join(COMM_FIELDS)}")
        comm = None
    by_costs: dict[Costs, list[int]] = {}
    for rank in ranks:
        by_costs.setdefault(costs[rank], []).append(rank)
    wrong = {mine: _disagreements(mine, rc, flops, comm, where) for mine in by_costs}
    # the costs most ranks share, among those the manifest agrees with if any does
    usual = max(by_costs, key=lambda c: (not wrong[c], len(by_costs[c]), -by_costs[c][0]), default=None)
    digest = rc.get("program_sha256")
    for mine, holders in by_costs.items():
        for rank in holders:
            for reason in wrong[mine]:
                out.at(rank, None, "", reason)
            if digest is not None and digest != costs[rank].program:
                out.at(rank, None, "", f"its nodes are not the program {where} was written with (program_sha256 "
                                       f"differs): a node's id, name, type, dependencies or costs changed")
            if mine is not usual:
                others = by_costs[usual]
                out.at(rank, None, "", f"its nodes add up to other costs than those of rank {others[0]}"
                                       f"{f' and {len(others) - 1} more' if len(others) > 1 else ''} of its "
                                       f"rank class ({_difference(mine, usual)})")


def _disagreements(mine: Costs, rc: dict, flops, comm, where: str) -> list[str]:
    """How the manifest's rank class ``rc`` disagrees with a rank of costs ``mine``."""
    out = []
    nodes = rc.get("nodes")
    if nodes is not None and nodes != mine.nodes:
        what = "its last nodes are missing" if _is_int(nodes) and mine.nodes < nodes else "it has other nodes"
        out.append(f"{mine.nodes:,} nodes, but {where} says {nodes!r}: {what}")
    if flops is not None and not mine.num_ops - mine.unit_ops <= flops["total"] <= mine.num_ops:
        out.append(f"its compute nodes hold {mine.num_ops:,} FLOPs (num_ops), but {where} says "
                   f"flops total {flops['total']:,}")
    kernel_bytes = rc.get("kernel_bytes")
    if kernel_bytes is not None and not (_is_int(kernel_bytes)
                                         and mine.tensor_size - mine.unit_bytes <= kernel_bytes <= mine.tensor_size):
        out.append(f"its compute nodes hold {mine.tensor_size:,} bytes (tensor_size), but {where} says "
                   f"kernel_bytes {kernel_bytes!r}")
    if comm is not None:
        for key, size in mine.comm:
            if comm[key] != size:
                out.append(f"its nodes move {size:,} bytes by {key}, but {where} says {comm[key]:,}")
    wire = rc.get("wire_bytes")
    if wire is not None:
        for key, size in mine.wire:
            if not isinstance(wire, dict) or wire.get(key) != size:
                said = wire.get(key, "(missing)") if isinstance(wire, dict) else repr(wire)
                out.append(f"its nodes put {size:,} bytes on the wire by {key} (the ring algorithm on its groups' "
                           f"sizes in comm_groups.json), but {where} says wire_bytes {key} {said}")
    micros = rc.get("compute_time_us")
    if micros is not None and micros != mine.micros:
        out.append(f"its compute nodes last {mine.micros:,} us (duration_micros), but {where} says "
                   f"compute_time_us {micros!r}")
    if mine.cpu_ops:
        out.append(f"{mine.cpu_ops} node(s) with is_cpu_op true: STAGE writes GPU programs only")
    return out


def _difference(mine: Costs, theirs: Costs) -> str:
    for field in ("nodes", "num_ops", "tensor_size", "micros", "cpu_ops"):
        a, b = getattr(mine, field), getattr(theirs, field)
        if a != b:
            return f"{field} {a:,} against {b:,}"
    for (key, a), (_, b) in zip(mine.comm, theirs.comm):
        if a != b:
            return f"{key} bytes {a:,} against {b:,}"
    return "a node's id, name, type, dependencies or costs"
