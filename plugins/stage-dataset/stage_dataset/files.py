"""A dataset folder: its files, how they are put together, written and read back.

``<split>.npz`` (split: train, val, test) holds the graphs of that split concatenated,
in LayerDAG's terms (its loader takes per graph ``src``, ``dst``, ``x_n`` and ``y``):

* ``num_nodes``, ``num_edges`` (one per graph), ``y`` (the plan's step time, seconds)
  and ``graph_time`` (the graph's own span in the estimator's replay, NaN without);
* ``src``, ``dst`` (per edge, node numbers within its graph, graph after graph) and
  ``e_kind`` (0 data, 1 control dependency);
* ``x_n`` (per node, its category's number in ``categories.json``), ``x_f`` (per node,
  the features of :data:`.graphs.FEATURES`, exact integers) and, with ``--node-times``,
  ``node_start`` and ``node_finish`` (seconds from the step's start).

Categories are numbered so that those of the training split come first (sorted by
name), as LayerDAG expects: its node types are 0..K-1, all seen in training, K the
dummy type it adds.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from stage_core.api import UsageError

from .graphs import EDGE_KINDS, FEATURES, kind_of
from .unit import PLAN_COLUMNS

SPLITS = ("train", "val", "test")
FORMAT = "stage-dataset 1"
#: every file a dataset folder may hold (``-o`` replaces a folder holding only these)
FILES = ("categories.json", "index.csv", "summary.json") + tuple(f"{s}.{x}" for s in SPLITS for x in ("npz", "pth"))
#: arrays of a split file, per graph, per edge and per node
PER_GRAPH = ("num_nodes", "num_edges", "y", "graph_time")
PER_EDGE = ("src", "dst", "e_kind")
PER_NODE = ("x_n", "x_f", "node_start", "node_finish")
FEATURE_UNITS = {"flops": "FLOPs", "bytes": "bytes", "message_bytes": "bytes", "group_size": "ranks"}


@dataclass
class Dataset:
    categories: list[dict[str, Any]]
    splits: dict[str, dict[str, np.ndarray]]
    index_columns: list[str]
    index_rows: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------- putting it together


def assemble(results: Sequence[Mapping], ids: Sequence[str], sweep, which: Mapping[int, str],
             node_times: bool) -> Dataset:
    """The splits of the evaluated units ``results`` (grid order); ``which[i]``: unit i's split."""
    used: dict[str, set[str]] = {s: set() for s in SPLITS}
    for i, s in which.items():
        meta, arrays = results[i]["meta"], results[i]["arrays"]
        used[s].update(meta["categories"][c] for c in np.unique(arrays["x_n"]).tolist())
    train = sorted(used["train"])
    rest = sorted((used["val"] | used["test"]) - used["train"])
    number = {name: k for k, name in enumerate(train + rest)}
    grid_keys = list(sweep.keys)
    extra = [c for c in ("model", *(col for col, _ in PLAN_COLUMNS), "hardware", "world_size") if c not in grid_keys]
    columns = ["split", "graph", "unit", *grid_keys, *extra, "rank_class", "ranks", "segment", "num_nodes",
               "num_edges", "y", "graph_time"]
    parts: dict[str, dict[str, list]] = {s: {} for s in SPLITS}
    rows: list[dict[str, Any]] = []
    counters = dict.fromkeys(SPLITS, 0)
    for i in sorted(which):
        s = which[i]
        meta, a = results[i]["meta"], results[i]["arrays"]
        lookup = np.asarray([number.get(name, -1) for name in meta["categories"]], np.int64)
        g = len(a["num_nodes"])
        got = parts[s]
        for key, value in (("num_nodes", a["num_nodes"]), ("num_edges", a["num_edges"]),
                           ("y", np.full(g, meta["step_time_s"])), ("graph_time", a["graph_time"]),
                           ("src", a["src"]), ("dst", a["dst"]), ("e_kind", a["e_kind"]),
                           ("x_n", lookup[a["x_n"]]), ("x_f", a["x_f"])):
            got.setdefault(key, []).append(value)
        if node_times:
            got.setdefault("node_start", []).append(a["node_start"])
            got.setdefault("node_finish", []).append(a["node_finish"])
        point = sweep.points[i].as_dict()
        info = {"model": meta["model"], **meta["plan"], "hardware": meta["hardware"], "world_size": meta["world_size"]}
        for k in range(g):
            row = {"split": s, "graph": counters[s], "unit": ids[i][:16], **{c: point.get(c, "") for c in grid_keys},
                   **{c: info.get(c, "") for c in extra}, "rank_class": int(a["rank_class"][k]),
                   "ranks": int(a["ranks"][k]), "segment": str(a["key"][k]), "num_nodes": int(a["num_nodes"][k]),
                   "num_edges": int(a["num_edges"][k]), "y": meta["step_time_s"],
                   "graph_time": float(a["graph_time"][k])}
            rows.append(row)
            counters[s] += 1
    splits = {s: _concatenated(parts[s], node_times) for s in SPLITS}
    return Dataset(_categories(train, rest, splits), splits, columns, rows)


def _concatenated(parts: Mapping[str, list], node_times: bool) -> dict[str, np.ndarray]:
    dtypes = {"num_nodes": np.int64, "num_edges": np.int64, "y": np.float64, "graph_time": np.float64,
              "src": np.int64, "dst": np.int64, "e_kind": np.int8, "x_n": np.int64, "x_f": np.int64,
              "node_start": np.float64, "node_finish": np.float64}
    keys = [*PER_GRAPH, *PER_EDGE, "x_n", "x_f"] + (["node_start", "node_finish"] if node_times else [])
    out = {}
    for key in keys:
        shape = (0, len(FEATURES)) if key == "x_f" else (0,)
        out[key] = np.concatenate(parts[key]).astype(dtypes[key]) if parts.get(key) else np.zeros(shape, dtypes[key])
    return out


def _categories(train: list[str], rest: list[str], splits) -> list[dict[str, Any]]:
    """One entry per category: its number, name, kind, whether training has it, how many nodes,
    and the median of each feature over them (what ``stage from-dag`` gives a node of that
    category whose graph has no features)."""
    x_n = np.concatenate([splits[s]["x_n"] for s in SPLITS])
    x_f = np.concatenate([splits[s]["x_f"] for s in SPLITS])
    out = []
    for k, name in enumerate(train + rest):
        rows = x_f[x_n == k]
        defaults = {f: int(np.median(rows[:, j])) if len(rows) else 0 for j, f in enumerate(FEATURES)}
        out.append({"id": k, "name": name, "kind": kind_of(name), "in_train": k < len(train), "nodes": int(len(rows)),
                    "defaults": defaults})
    return out


# --------------------------------------------------------------------------- writing


def require_torch(flag: str):
    try:
        import torch
    except ImportError:
        raise UsageError(f"{flag}: LayerDAG's .pth files need torch, which is not installed: "
                         "pip install 'stage-dataset[torch]'") from None
    return torch


def check_output(path: Path) -> None:
    """``-o DIR`` may be absent, an empty folder, or a dataset folder (only :data:`FILES`)."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"-o {path}: is a file; give a folder for the dataset")
    if path.is_dir():
        others = sorted(p.name for p in path.iterdir() if p.name not in FILES)
        if others:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise UsageError(f"-o {path}: holds files that are not a dataset's ({shown}); give an empty or new folder")


def write(output: Path, data: Dataset, summary: Mapping[str, Any], pth: bool) -> None:
    """Every file into a temporary folder beside ``output``, then renamed into place."""
    check_output(output)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    old = output.with_name(f".{output.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for s in SPLITS:
            np.savez(tmp / f"{s}.npz", **data.splits[s])
            if pth:
                write_pth(tmp / f"{s}.pth", data.splits[s])
        (tmp / "categories.json").write_text(json.dumps(categories_json(data.categories), indent=1) + "\n")
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=data.index_columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(data.index_rows)
        (tmp / "index.csv").write_text(buf.getvalue())
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        if output.exists():
            output.rename(old)
        tmp.rename(output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def categories_json(categories: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": FORMAT, "num_categories": sum(c["in_train"] for c in categories),
            "categories": categories, "features": list(FEATURES), "feature_units": FEATURE_UNITS,
            "edge_kinds": list(EDGE_KINDS)}


def layerdag_lists(split: Mapping[str, np.ndarray]) -> dict[str, list]:
    """A split as LayerDAG's loader takes it: ``src_list``, ``dst_list``, ``x_n_list`` (one
    integer array per graph) and ``y_list`` (one float per graph)."""
    graphs = Split(split, "split")
    out: dict[str, list] = {"src_list": [], "dst_list": [], "x_n_list": [], "y_list": []}
    for i in range(len(graphs)):
        g = graphs.graph(i)
        out["src_list"].append(g["src"])
        out["dst_list"].append(g["dst"])
        out["x_n_list"].append(g["x_n"])
        out["y_list"].append(float(g["y"]))
    return out


def write_pth(path: Path, split: Mapping[str, np.ndarray]) -> None:
    torch = require_torch("--pth")
    lists = layerdag_lists(split)
    torch.save({"src_list": [torch.from_numpy(np.ascontiguousarray(a)) for a in lists["src_list"]],
                "dst_list": [torch.from_numpy(np.ascontiguousarray(a)) for a in lists["dst_list"]],
                "x_n_list": [torch.from_numpy(np.ascontiguousarray(a)) for a in lists["x_n_list"]],
                "y_list": lists["y_list"]}, path)


# --------------------------------------------------------------------------- reading


class Split:
    """The graphs of one split file (or its arrays), one at a time."""

    def __init__(self, arrays: Mapping[str, np.ndarray], where: str):
        self.where = where
        missing = [k for k in ("num_nodes", "num_edges", "src", "dst", "x_n") if k not in arrays]
        if missing:
            raise UsageError(f"{where}: not a dataset split file (no {', '.join(missing)})")
        self.a = arrays
        nodes = np.asarray(arrays["num_nodes"], np.int64)
        edges = np.asarray(arrays["num_edges"], np.int64)
        if len(nodes) != len(edges) or (nodes < 0).any() or (edges < 0).any() \
                or int(nodes.sum()) != len(arrays["x_n"]) or int(edges.sum()) != len(arrays["src"]) \
                or len(arrays["src"]) != len(arrays["dst"]):
            raise UsageError(f"{where}: num_nodes/num_edges do not add up to the x_n/src/dst arrays")
        self.node_at = np.concatenate([[0], np.cumsum(nodes)])
        self.edge_at = np.concatenate([[0], np.cumsum(edges)])

    def __len__(self) -> int:
        return len(self.node_at) - 1

    def graph(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise UsageError(f"--graph {i}: {self.where} has {len(self)} graphs (0..{len(self) - 1})")
        n0, n1 = self.node_at[i], self.node_at[i + 1]
        e0, e1 = self.edge_at[i], self.edge_at[i + 1]
        out = {"src": np.asarray(self.a["src"][e0:e1], np.int64), "dst": np.asarray(self.a["dst"][e0:e1], np.int64),
               "x_n": np.asarray(self.a["x_n"][n0:n1], np.int64),
               "y": float(self.a["y"][i]) if "y" in self.a else float("nan")}
        for key in ("x_f",):
            if key in self.a:
                out[key] = np.asarray(self.a[key][n0:n1], np.int64)
        if "e_kind" in self.a:
            out["e_kind"] = np.asarray(self.a["e_kind"][e0:e1], np.int64)
        return out


def load_split(path: Path) -> Split:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise UsageError(f"{path}: not a numpy .npz file ({exc})") from None
    return Split(arrays, str(path))
