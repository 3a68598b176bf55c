"""A DAG to run: nodes with a category and sizes, edges, read from a dataset split (.npz),
LayerDAG's own files (.pth) or a small JSON file.

A JSON DAG::

    {"nodes": [{"type": "einsum/forward", "flops": 137438953472, "bytes": 100663296},
               {"type": "all_reduce", "message_bytes": 67108864, "group_size": 4},
               {"type": "send"}, {"type": "recv"}],
     "edges": [[3, 0], [0, 1], [1, 2]]}

Nodes are numbered by their place in the list, or by their ``"id"`` when every node
has one; an edge is ``[from, to]`` (a data dependency) or ``[from, to, "control"]``.
A node's ``type`` is a category: of ``categories.json`` when one is given, else
``compute`` (or any ``kind/phase`` name such as ``einsum/forward``), a collective type
(``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``), ``send`` or
``recv``.  Sizes left out come from the category's defaults (the medians of its nodes
in the dataset, ``categories.json``) or, without one, :data:`DEFAULTS`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from stage_core.api import UsageError, read_json

from .files import load_split, require_torch, Split
from .graphs import COLLECTIVES, EDGE_KINDS, FEATURES, kind_of

#: sizes of a node whose graph gives none and whose category has no dataset defaults: a
#: 4096 x 4096 x 4096 bf16 GEMM (2·4096³ FLOPs; its two inputs and output, 3·4096²·2 bytes);
#: a message of one pipeline activation, s·b·h·2 bytes with s = 4096, b = 2, h = 4096
#: (REFERENCE §3), over a group of 2
DEFAULTS = {
    "compute": {"flops": 2 * 4096 ** 3, "bytes": 3 * 4096 ** 2 * 2, "message_bytes": 0, "group_size": 1},
    "collective": {"flops": 0, "bytes": 0, "message_bytes": 4096 * 2 * 4096 * 2, "group_size": 2},
    "send": {"flops": 0, "bytes": 0, "message_bytes": 4096 * 2 * 4096 * 2, "group_size": 2},
    "recv": {"flops": 0, "bytes": 0, "message_bytes": 4096 * 2 * 4096 * 2, "group_size": 2},
}
_NODE_KEYS = ("id", "type", "name", *FEATURES)


@dataclass
class Dag:
    """Nodes (category name, kind, the :data:`.graphs.FEATURES`) and edges ``(src, dst, kind)``,
    kind 0 data, 1 control; ``source`` says where it came from."""

    categories: list[str]
    kinds: list[str]
    features: np.ndarray  # (nodes, len(FEATURES)) int64
    edges: list[tuple[int, int, int]]
    source: dict[str, Any]

    def __len__(self) -> int:
        return len(self.categories)

    def order(self) -> list[int]:
        """The nodes in an order where each comes after the nodes it depends on (the lowest
        number first among those ready); a cycle is refused, naming a node on it."""
        n = len(self)
        users: list[list[int]] = [[] for _ in range(n)]
        waits = [0] * n
        for src, dst, _ in self.edges:
            users[src].append(dst)
            waits[dst] += 1
        ready = [i for i in range(n) if waits[i] == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            i = heapq.heappop(ready)
            out.append(i)
            for j in users[i]:
                waits[j] -= 1
                if waits[j] == 0:
                    heapq.heappush(ready, j)
        if len(out) < n:
            stuck = min(i for i in range(n) if waits[i] > 0)
            raise UsageError(f"{self.source['file']}: not a DAG: node {stuck} is on a cycle of dependencies")
        return out


# --------------------------------------------------------------------------- categories


def load_categories(path: Path) -> dict[str, dict[str, Any]]:
    """``categories.json`` of a dataset: name -> its entry (id, kind, defaults)."""
    data = read_json(path, f"--categories {path}")  # (regular, bounded in size and depth)
    try:
        entries = data["categories"]
        out = {}
        for c in entries:
            kind = c.get("kind") or kind_of(c["name"])
            given = c.get("defaults") or {}
            out[c["name"]] = {"id": int(c["id"]), "kind": kind,
                              "defaults": {f: int(given.get(f, DEFAULTS[kind][f])) for f in FEATURES}}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"--categories {path}: not a dataset's categories.json (a list of categories with "
                         f"id, name, kind and defaults)") from None
    return out


def _by_id(categories: Mapping[str, Mapping], where: str) -> dict[int, str]:
    by_id = {c["id"]: name for name, c in categories.items()}
    if len(by_id) != len(categories):
        raise UsageError(f"{where}: two categories share a number")
    return by_id


def _sizes(kind: str, given: Mapping[str, Any], defaults: Mapping[str, int]) -> list[int]:
    return [int(given[f]) if given.get(f) is not None else int(defaults[f]) for f in FEATURES]


# --------------------------------------------------------------------------- reading


def read(path: Path, graph: int, categories: Path | None, features: bool = True) -> Dag:
    """The DAG number ``graph`` of ``path`` (.npz or .pth: a split; .json: one DAG)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npz", ".pth", ".json"):
        raise UsageError(f"{path}: unknown kind of file {suffix or '(no suffix)'!r}; give a dataset split (.npz), "
                         f"LayerDAG's .pth or a JSON DAG (.json)")
    if categories is None and suffix != ".json":
        categories = path.with_name("categories.json")
        if not categories.is_file():
            raise UsageError(f"{path}: its node categories are numbers; give their names with --categories "
                             f"(no categories.json beside it)")
    cats = load_categories(categories) if categories is not None else None
    if suffix == ".json":
        if graph != 0:
            raise UsageError(f"--graph {graph}: a JSON file holds one DAG (graph 0)")
        return _from_json(path, cats)
    split = load_split(path) if suffix == ".npz" else _load_pth(path)
    return _from_split(split, graph, cats, str(path), features)


def _load_pth(path: Path) -> Split:
    torch = require_torch(str(path))
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        lists = [data[k] for k in ("src_list", "dst_list", "x_n_list")]
    except (OSError, RuntimeError, KeyError, TypeError, ValueError, EOFError) as exc:
        raise UsageError(f"{path}: not LayerDAG's .pth (a dict of src_list, dst_list, x_n_list: {exc})") from None

    def array(t) -> np.ndarray:
        return np.asarray(t.cpu().numpy() if hasattr(t, "cpu") else t)

    src, dst = ([array(t).astype(np.int64).reshape(-1) for t in lst] for lst in lists[:2])
    x_n = [array(t) for t in lists[2]]
    if any(x.ndim != 1 for x in x_n):
        raise UsageError(f"{path}: a graph's x_n has several attributes per node; stage from-dag takes one "
                         f"category per node")
    x_n = [x.astype(np.int64) for x in x_n]
    ys = [float(y) for y in data.get("y_list", [])] or [float("nan")] * len(x_n)
    arrays = {"num_nodes": np.asarray([len(x) for x in x_n], np.int64),
              "num_edges": np.asarray([len(s) for s in src], np.int64),
              "src": np.concatenate(src) if src else np.zeros(0, np.int64),
              "dst": np.concatenate(dst) if dst else np.zeros(0, np.int64),
              "x_n": np.concatenate(x_n) if x_n else np.zeros(0, np.int64), "y": np.asarray(ys)}
    return Split(arrays, str(path))


def _from_split(split: Split, graph: int, cats, where: str, features: bool) -> Dag:
    g = split.graph(graph)
    by_id = _by_id(cats, "--categories")
    n = len(g["x_n"])
    names = []
    for i, c in enumerate(g["x_n"].tolist()):
        if c not in by_id:
            raise UsageError(f"{where} graph {graph}, node {i}: category {c} is not in categories.json "
                             f"(0..{max(by_id)})")
        names.append(by_id[c])
    kinds = [cats[name]["kind"] for name in names]
    if features and "x_f" in g:
        feats = np.asarray(g["x_f"], np.int64).reshape(n, len(FEATURES))
    else:
        feats = np.asarray([[cats[name]["defaults"][f] for f in FEATURES] for name in names], np.int64).reshape(
            n, len(FEATURES))
    e_kind = g.get("e_kind", np.zeros(len(g["src"]), np.int64))
    edges = _checked_edges(zip(g["src"].tolist(), g["dst"].tolist(), e_kind.tolist()), n, f"{where} graph {graph}")
    return Dag(names, kinds, feats, edges, {"file": where, "graph": graph, "y": g["y"],
                                           "features": "given" if features and "x_f" in g else "defaults"})


def _checked_edges(edges, n: int, where: str) -> list[tuple[int, int, int]]:
    out = []
    seen = set()
    for src, dst, kind in edges:
        if not (0 <= src < n and 0 <= dst < n):
            raise UsageError(f"{where}: edge {src} -> {dst} names a node outside 0..{n - 1}")
        if src == dst:
            raise UsageError(f"{where}: edge {src} -> {dst} is a loop; a DAG has none")
        if (src, dst) not in seen:
            seen.add((src, dst))
            out.append((int(src), int(dst), int(kind)))
    return out


def _from_json(path: Path, cats) -> Dag:
    data = read_json(path, str(path))  # (regular, bounded in size and depth)
    where = str(path)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not data["nodes"]:
        raise UsageError(f"{where}: expected {{\"nodes\": [...], \"edges\": [...]}} with at least one node")
    nodes = data["nodes"]
    unknown = sorted(set(data) - {"nodes", "edges"})
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; valid: nodes, edges")
    has_ids = all(isinstance(x, dict) and "id" in x for x in nodes)
    index: dict[Any, int] = {}
    names, kinds, feats = [], [], []
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or not isinstance(node.get("type"), str):
            raise UsageError(f"{where}: node {i}: give an object with a \"type\" (a category)")
        bad = sorted(set(node) - set(_NODE_KEYS))
        if bad:
            raise UsageError(f"{where}: node {i}: unknown key {bad[0]!r}; valid: {', '.join(_NODE_KEYS)}")
        key = node["id"] if has_ids else i
        if key in index:
            raise UsageError(f"{where}: node id {key!r} is given twice")
        index[key] = i
        name = node["type"]
        if cats is not None:
            if name not in cats:
                raise UsageError(f"{where}: node {key}: type {name!r} is not in categories.json; known: "
                                 f"{', '.join(sorted(cats))}")
            kind, defaults = cats[name]["kind"], cats[name]["defaults"]
        else:
            kind = kind_of(name)
            if kind == "compute" and name != "compute" and "/" not in name:
                raise UsageError(f"{where}: node {key}: type {name!r}: valid types are compute (or a kind/phase "
                                 f"name such as einsum/forward), {', '.join(COLLECTIVES)}, send and recv")
            defaults = DEFAULTS[kind]
        for f in FEATURES:
            value = node.get(f)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise UsageError(f"{where}: node {key}: {f} {value!r}: give a whole number, 0 or more")
        names.append(name)
        kinds.append(kind)
        feats.append(_sizes(kind, node, defaults))
    edges = []
    for e in data.get("edges", []):
        if not isinstance(e, list) or len(e) not in (2, 3) or (len(e) == 3 and e[2] not in EDGE_KINDS):
            raise UsageError(f"{where}: edge {e!r}: give [from, to] or [from, to, \"control\"]")
        for end in e[:2]:
            if end not in index:
                raise UsageError(f"{where}: edge {e!r}: no node {end!r}")
        edges.append((index[e[0]], index[e[1]], EDGE_KINDS.index(e[2]) if len(e) == 3 else 0))
    edges = _checked_edges(edges, len(nodes), where)
    return Dag(names, kinds, np.asarray(feats, np.int64).reshape(len(nodes), len(FEATURES)), edges,
               {"file": where, "graph": 0, "features": "given"})
