"""Rank programs as graphs: each node a category and numeric features, each dependency an edge.

A rank-class program (:class:`stage_core.api.RankProgram`) is a DAG already: node i
depends only on nodes before it.  It becomes one graph per *step* (the whole program of
a training step), per *segment* (one schedule step: a micro-batch's forward through a
chunk, its backward with any recompute, its weight-gradient step, and the tail of
gradient reductions and optimizer), or per *layer* (a segment's nodes of one layer, and
the rest of the segment).  Segments and layers are read off the node names lowering
gives (``[stepJ.]mbM[.chunkC].fwd|bwd|recompute|w...``, ``...layers.N...``); any other
name (``grad_sync.*``, ``optimizer.*``) is the tail.  An edge joins two nodes of the
same graph; a dependency on a node of another graph is left out, so a graph's first
nodes are its roots.

Node categories are strings: a compute node ``<kind>[:<fn>]/<phase>`` of its kernel
(``einsum/forward``, ``norm:rmsnorm/backward``, ``fused:flash_attention/forward``), a
collective its type (``all_reduce``, ``all_gather``, ``reduce_scatter``,
``all_to_all``), ``send`` and ``recv``.  A dataset numbers them (``categories.json``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from stage_core.api import COMM_KEYS, CollectiveType, NodeType, RankProgram, TraceJob

#: numeric features per node, in ``x_f`` column order: FLOPs (compute), bytes a kernel
#: reads and writes (compute), bytes a message or collective moves per rank (ASTRA-sim's
#: comm_size), ranks taking part (1 for a kernel, 2 for a send or receive, the group's
#: size for a collective)
FEATURES = ("flops", "bytes", "message_bytes", "group_size")
#: ``e_kind`` values: a data dependency, a control dependency (ordering only)
EDGE_KINDS = ("data", "control")
GRANULARITIES = ("step", "segment", "layer")
COLLECTIVES = tuple(COMM_KEYS.values())
KINDS = ("compute", "collective", "send", "recv")

_STEP = re.compile(r"^((?:step\d+\.)?mb\d+(?:\.chunk\d+)?)\.(fwd|bwd|recompute|w)(?=[.:]|$)")
_PHASE = {"fwd": "fwd", "bwd": "bwd", "recompute": "bwd", "w": "w"}
_LAYER = re.compile(r"(?:^|[.:])layers\.(\d+)(?=[.:]|$)")
TAIL = "tail"


def category(node) -> str:
    """The category of one program node (see the module docstring)."""
    if node.type == NodeType.COMP:
        k = node.kernel
        if k is None:
            return "compute"
        kind = k.kind if not k.fn or k.fn == k.kind else f"{k.kind}:{k.fn}"
        return f"{kind}/{k.phase}"
    if node.type == NodeType.COMM_COLL:
        return COMM_KEYS.get(node.comm_type) or CollectiveType(node.comm_type).name.lower()
    return "send" if node.type == NodeType.COMM_SEND else "recv"


def kind_of(name: str) -> str:
    """``compute``, ``collective``, ``send`` or ``recv``: what a category is."""
    if name in ("send", "recv"):
        return name
    if name in COLLECTIVES or name.upper() in CollectiveType.__members__:
        return "collective"
    return "compute"


def segment_of(name: str) -> str:
    """The schedule step a node belongs to (``mb3.chunk1.bwd``), or ``tail``."""
    m = _STEP.match(name)
    return f"{m.group(1)}.{_PHASE[m.group(2)]}" if m else TAIL


def layer_of(name: str) -> str:
    """``layers.N`` for a node of layer N, else ``other`` (embedding, head, loss, messages...)."""
    m = _STEP.match(name)
    m = _LAYER.search(name, m.end() if m else 0)
    return f"layers.{m.group(1)}" if m else "other"


def graph_key(name: str, granularity: str) -> str:
    if granularity == "step":
        return "step"
    if granularity == "segment":
        return segment_of(name)
    return f"{segment_of(name)}/{layer_of(name)}"


@dataclass
class Graphs:
    """Graphs concatenated as a dataset file holds them: per graph ``num_nodes`` and
    ``num_edges``; per edge ``src``, ``dst`` (node numbers within its graph) and ``e_kind``;
    per node ``x_n`` (category numbers into ``categories``), ``x_f`` (:data:`FEATURES`), and
    with times ``node_start``/``node_finish`` (seconds from the step's start); per graph
    its rank class, the ranks running it, its key (``step``, a segment, segment/layer) and
    ``graph_time`` (its last finish less its first start)."""

    categories: list[str] = field(default_factory=list)
    num_nodes: list[int] = field(default_factory=list)
    num_edges: list[int] = field(default_factory=list)
    src: list[np.ndarray] = field(default_factory=list)
    dst: list[np.ndarray] = field(default_factory=list)
    e_kind: list[np.ndarray] = field(default_factory=list)
    x_n: list[np.ndarray] = field(default_factory=list)
    x_f: list[np.ndarray] = field(default_factory=list)
    node_start: list[np.ndarray] = field(default_factory=list)
    node_finish: list[np.ndarray] = field(default_factory=list)
    rank_class: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    key: list[str] = field(default_factory=list)
    graph_time: list[float] = field(default_factory=list)
    too_large: int = 0  # graphs left out for having more nodes than the bound

    def arrays(self, node_times: bool) -> dict[str, np.ndarray]:
        """The concatenated arrays (the unit's part of a dataset file)."""
        def cat(parts, dtype, shape=(0,)):
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(shape, dtype)

        out = {"num_nodes": np.asarray(self.num_nodes, np.int64), "num_edges": np.asarray(self.num_edges, np.int64),
               "src": cat(self.src, np.int64), "dst": cat(self.dst, np.int64), "e_kind": cat(self.e_kind, np.int8),
               "x_n": cat(self.x_n, np.int64), "x_f": cat(self.x_f, np.int64, (0, len(FEATURES))),
               "rank_class": np.asarray(self.rank_class, np.int64), "ranks": np.asarray(self.ranks, np.int64),
               "key": np.asarray(self.key, dtype=str), "graph_time": np.asarray(self.graph_time, np.float64)}
        if node_times:
            out["node_start"] = cat(self.node_start, np.float64)
            out["node_finish"] = cat(self.node_finish, np.float64)
        return out


def group_sizes(job: TraceJob, program: RankProgram) -> dict[str | None, int]:
    """Members of each collective group key of ``program`` (as its first rank sees them)."""
    rank = program.ranks[0]
    out: dict[str | None, int] = {}
    for node in program.nodes:
        if node.type == NodeType.COMM_COLL and node.group not in out:
            out[node.group] = (job.world_size if node.group is None
                               else len(job.comm_groups[job.group_name(rank, node.group)]))
    return out


def program_graphs(job: TraceJob, granularity: str, max_nodes: int, starts: Sequence | None = None,
                   finishes: Sequence | None = None) -> Graphs:
    """Every rank class's program of ``job`` as graphs (``starts``/``finishes``: per class,
    each node's times from an estimator, or None)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity {granularity!r}; valid: {', '.join(GRANULARITIES)}")
    out = Graphs()
    ids: dict[str, int] = {}
    for c, program in enumerate(job.programs):
        nodes = program.nodes
        sizes = group_sizes(job, program)
        cats = np.empty(len(nodes), np.int64)
        feats = np.zeros((len(nodes), len(FEATURES)), np.int64)
        groups: dict[str, list[int]] = {}
        for pos, node in enumerate(nodes):
            name = category(node)
            cid = ids.get(name)
            if cid is None:
                cid = ids[name] = len(out.categories)
                out.categories.append(name)
            cats[pos] = cid
            if node.type == NodeType.COMP:
                feats[pos] = (node.num_ops, node.tensor_size, 0, 1)
            elif node.type == NodeType.COMM_COLL:
                feats[pos] = (0, 0, node.comm_size, sizes[node.group])
            else:
                feats[pos] = (0, 0, node.comm_size, 2)
            groups.setdefault(graph_key(node.name, granularity), []).append(pos)
        start = None if starts is None else np.asarray(starts[c], np.float64)
        finish = None if finishes is None else np.asarray(finishes[c], np.float64)
        for key, members in groups.items():
            if len(members) > max_nodes:
                out.too_large += 1
                continue
            local = {pos: i for i, pos in enumerate(members)}
            src, dst, kinds = [], [], []
            for pos in members:
                node = nodes[pos]
                seen = set()
                for kind, deps in ((0, node.data_deps), (1, node.ctrl_deps)):
                    for d in deps:
                        i = local.get(d)
                        if i is not None and i not in seen:
                            seen.add(i)
                            src.append(i)
                            dst.append(local[pos])
                            kinds.append(kind)
            at = np.asarray(members, np.int64)
            out.num_nodes.append(len(members))
            out.num_edges.append(len(src))
            out.src.append(np.asarray(src, np.int64))
            out.dst.append(np.asarray(dst, np.int64))
            out.e_kind.append(np.asarray(kinds, np.int8))
            out.x_n.append(cats[at])
            out.x_f.append(feats[at])
            out.rank_class.append(c)
            out.ranks.append(len(program.ranks))
            out.key.append(key)
            if start is not None and finish is not None:
                out.node_start.append(start[at])
                out.node_finish.append(finish[at])
                out.graph_time.append(float(finish[at].max() - start[at].min()))
            else:
                out.graph_time.append(float("nan"))
    return out
