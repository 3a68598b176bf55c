"""What LayerDAG's data loader asks of a dataset (Graph-COM/LayerDAG, src/dataset): per graph
``src`` and ``dst`` (integer node numbers within the graph), ``x_n`` (one integer category
per node) and ``y`` (a number); categories 0..K-1 all present in training, K being its dummy
type (``num_categories = max(train x_n) + 1``; its node-prediction dataset asserts that the
categories it sees, the dummy included, are consecutive from 0); and its layer-by-layer
walk (a dummy node before the graph, then the nodes whose in-degree drops to zero, layer
after layer) must reach every node, so the graph is acyclic.  Checked here with numpy,
as a user without torch reads the .npz files."""

from __future__ import annotations

import numpy as np


def lists(split) -> dict[str, list]:
    """A split file's arrays as LayerDAG's ``src_list``, ``dst_list``, ``x_n_list``, ``y_list``."""
    nodes, edges = split["num_nodes"], split["num_edges"]
    n_at = np.concatenate([[0], np.cumsum(nodes)])
    e_at = np.concatenate([[0], np.cumsum(edges)])
    return {"src_list": [split["src"][e_at[i]:e_at[i + 1]] for i in range(len(nodes))],
            "dst_list": [split["dst"][e_at[i]:e_at[i + 1]] for i in range(len(nodes))],
            "x_n_list": [split["x_n"][n_at[i]:n_at[i + 1]] for i in range(len(nodes))],
            "y_list": [float(y) for y in split["y"]]}


def layers(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> list[int]:
    """The sizes of LayerDAG's layers of one graph (its node-count dataset's labels, the
    final 0 left out): a dummy node 0, the graph's nodes shifted by one."""
    src, dst = src + 1, dst + 1
    in_deg = np.bincount(dst, minlength=num_nodes + 1).tolist()
    out: dict[int, list[int]] = {}
    for s, d in zip(src.tolist(), dst.tolist()):
        out.setdefault(s, []).append(d)
    frontier = [u for u in range(1, num_nodes + 1) if in_deg[u] == 0]
    sizes = []
    while frontier:
        sizes.append(len(frontier))
        nxt = []
        for u in frontier:
            for v in out.get(u, ()):
                in_deg[v] -= 1
                if in_deg[v] == 0:
                    nxt.append(v)
        frontier = nxt
    return sizes


def check(train, *others) -> int:
    """Assert LayerDAG's contract over a dataset's splits (train first); returns num_categories."""
    got = [lists(s) for s in (train, *others)]
    assert got[0]["x_n_list"], "the training split has no graph"
    num_categories = int(np.concatenate(got[0]["x_n_list"]).max()) + 1
    # the node-prediction dataset's assertion: categories (and the dummy) are 0..K, all seen
    seen = np.unique(np.concatenate(got[0]["x_n_list"] + [np.array([num_categories])]))
    assert seen.tolist() == list(range(num_categories + 1)), "training categories are not consecutive from 0"
    for split in got:
        for src, dst, x_n, y in zip(split["src_list"], split["dst_list"], split["x_n_list"], split["y_list"]):
            n = len(x_n)
            assert src.dtype.kind == dst.dtype.kind == x_n.dtype.kind == "i" and x_n.ndim == 1
            assert len(src) == len(dst) and ((0 <= src) & (src < n) & (0 <= dst) & (dst < n)).all()
            assert x_n.min() >= 0 and x_n.max() < num_categories, "a category would collide with the dummy"
            assert sum(layers(src, dst, n)) == n, "the layer-by-layer walk does not reach every node"
            assert np.isfinite(y) and y > 0
    return num_categories
