"""A baseline surrogate on a `stage dataset`: graph-level features into gradient-boosted trees,
trained on the train split, its error on the test split (the number to beat).

Two targets:

* ``graph_time``, per graph: the graph's own span in the estimator's replay (a schedule
  step's forward or backward, or the tail), which the graph's kernels and messages decide;
* ``y``, per plan: the step time, from the features of all the plan's graphs added up
  (one row per plan, as index.csv groups graphs by ``unit``).

Features of a graph: nodes, edges, depth (LayerDAG's layers), and per category its nodes
and the log of its FLOPs, bytes and message bytes.  The model: scikit-learn's
HistGradientBoostingRegressor on log(target) (``pip install 'plugins/stage-dataset[surrogate]'``).
Errors: mean and median absolute percentage error on the test split, beside predicting the
training median for every graph.

Run: ``python benchmarks/bench_surrogate.py [DATASET_DIR]`` (default: the dataset
``benchmarks/bench_dataset.py`` leaves in /tmp/stage-bench-dataset/local).
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import numpy as np


def depth(src: np.ndarray, dst: np.ndarray, n: int) -> int:
    """LayerDAG's layers of a graph: how many rounds of taking the nodes no edge waits on."""
    level = np.zeros(n, np.int64)
    order = np.argsort(dst, kind="stable")  # edges go from lower to higher node numbers in STAGE's graphs
    for s, d in zip(src[order].tolist(), dst[order].tolist()):
        if level[s] + 1 > level[d]:
            level[d] = level[s] + 1
    return int(level.max()) + 1 if n else 0


def graph_features(split: dict, k: int) -> np.ndarray:
    """One row per graph: nodes, edges, depth; per category nodes, log1p of FLOPs, bytes, message bytes."""
    nodes, edges = split["num_nodes"], split["num_edges"]
    n_at = np.concatenate([[0], np.cumsum(nodes)])
    e_at = np.concatenate([[0], np.cumsum(edges)])
    graph_of = np.repeat(np.arange(len(nodes)), nodes)
    x_n, x_f = split["x_n"], split["x_f"].astype(np.float64)
    per_cat = np.zeros((len(nodes), 4 * k))
    np.add.at(per_cat, (graph_of, x_n), 1.0)
    for j in range(3):
        np.add.at(per_cat, (graph_of, (j + 1) * k + x_n), x_f[:, j])
    per_cat[:, k:] = np.log1p(per_cat[:, k:])
    depths = [depth(split["src"][e_at[i]:e_at[i + 1]], split["dst"][e_at[i]:e_at[i + 1]], int(nodes[i]))
              for i in range(len(nodes))]
    return np.column_stack([nodes, edges, depths, per_cat])


def errors(pred: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    ape = np.abs(pred - true) / true
    return float(ape.mean()), float(np.median(ape))


def main() -> None:
    where = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/stage-bench-dataset/local")
    try:
        from sklearn.ensemble import HistGradientBoostingRegressor
    except ImportError:
        raise SystemExit("needs scikit-learn: pip install 'plugins/stage-dataset[surrogate]'")
    k = len(json.loads((where / "categories.json").read_text())["categories"])
    splits = {s: dict(np.load(where / f"{s}.npz")) for s in ("train", "val", "test")}
    with open(where / "index.csv") as f:
        rows = list(csv.DictReader(f))
    start = time.perf_counter()
    feats = {s: graph_features(splits[s], k) for s in splits}
    print(f"{where}: {sum(len(v['y']) for v in splits.values())} graphs, {k} categories, "
          f"{feats['train'].shape[1]} features per graph ({time.perf_counter() - start:.1f} s)")

    # per graph: its own span (graphs that take no time, a lone receive, left out)
    timed = {s: splits[s]["graph_time"] > 0 for s in splits}
    if not timed["train"].any():
        raise SystemExit(f"{where}: no graph_time (labelled by an estimator without node times?)")
    model = HistGradientBoostingRegressor(max_iter=500, learning_rate=0.05, random_state=0)
    model.fit(feats["train"][timed["train"]], np.log(splits["train"]["graph_time"][timed["train"]]))
    for s in ("val", "test"):
        true = splits[s]["graph_time"][timed[s]]
        mean, median = errors(np.exp(model.predict(feats[s][timed[s]])), true)
        base = errors(np.full(len(true), np.median(splits["train"]["graph_time"][timed["train"]])), true)
        print(f"graph_time, {s:<4} ({len(true)} graphs): mean APE {100 * mean:.1f}%, median APE {100 * median:.1f}% "
              f"(training median for all: {100 * base[0]:.0f}%, {100 * base[1]:.0f}%)")

    # per plan: the step, from its graphs' features added up
    def per_plan(s):
        units = [r["unit"] for r in rows if r["split"] == s]
        names = list(dict.fromkeys(units))
        at = {u: i for i, u in enumerate(names)}
        x = np.zeros((len(names), feats[s].shape[1] + 1))
        idx = np.asarray([at[u] for u in units])
        np.add.at(x[:, :-1], idx, feats[s])
        np.add.at(x[:, -1], idx, 1.0)  # graphs of the plan
        y = np.zeros(len(names))
        y[idx] = splits[s]["y"]
        return x, y

    (xt, yt), plans = per_plan("train"), {s: per_plan(s) for s in ("val", "test")}
    model = HistGradientBoostingRegressor(max_iter=500, learning_rate=0.05, random_state=0)
    model.fit(xt, np.log(yt))
    for s, (x, y) in plans.items():
        mean, median = errors(np.exp(model.predict(x)), y)
        base = errors(np.full(len(y), np.median(yt)), y)
        print(f"step y, {s:<4} ({len(y)} plans): mean APE {100 * mean:.1f}%, median APE {100 * median:.1f}% "
              f"(training median for all: {100 * base[0]:.0f}%, {100 * base[1]:.0f}%)")


if __name__ == "__main__":
    main()
