"""How fast `stage dataset` builds a 10,000-graph dataset, on the local executor, again from the
cache, and on Ray; and what it is (the issue 24 figures).

The grid: four model families (GPT-3 175B, Llama 3 8B, Mixtral 8x7B, Gemma 2 9B shapes, four
layers each) over tp, pp, dp, ep, micro-batches and sequence length; each plan timed on an
H100 and labelled with the replay estimator (`stage estimate`'s step), its rank programs cut
into schedule-step segments of at most 400 nodes (LayerDAG's scale).

Prints, per run: wall seconds, points evaluated and cached, graphs per split, nodes per
graph (median, max), categories, and whether the Ray run's files equal the local run's.

Run: ``python benchmarks/bench_dataset.py [--workers 2] [--out /tmp/stage-bench-dataset] [--no-ray]``
(Ray: ``pip install 'plugins/stage-executor-ray[ray]'``).  The dataset stays in ``--out``/local
for ``benchmarks/bench_surrogate.py``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

GRID = """
measure = "estimate"

[base]
set = "layers=4"

[[grid]]
model = ["gpt3-175b", "llama3-8b", "gemma2-9b"]
tp = [1, 2, 4]
pp = [1, 2, 4]
dp = [1, 2, 4]
micro-batches = [4, 8]
seq-len = [1024, 2048]

[[grid]]
model = ["mixtral-8x7b"]
tp = [1, 2]
ep = [1, 2, 4]
dp = [4]
pp = [1, 2]
micro-batches = [4, 8]
seq-len = [1024, 2048]
"""


def build(out: Path, cache: Path, executor: str, workers: int) -> tuple[float, dict, str]:
    exe = shutil.which("stage") or str(Path(sys.executable).parent / "stage")
    args = [exe, "dataset", str(out.parent / "grid.toml"), "-o", str(out), "--cache", str(cache),
            "--executor", executor, "--workers", str(workers)]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"stage dataset failed: {done.stderr}")
    return seconds, json.loads((out / "summary.json").read_text()), done.stderr.strip().splitlines()[-1]


def same_files(a: Path, b: Path) -> bool:
    for name in ("index.csv", "categories.json"):
        if (a / name).read_text() != (b / name).read_text():
            return False
    for split in ("train", "val", "test"):
        x, y = np.load(a / f"{split}.npz"), np.load(b / f"{split}.npz")
        if sorted(x.files) != sorted(y.files):
            return False
        for k in x.files:
            if not np.array_equal(x[k], y[k], equal_nan=True):
                return False
    return True


def report(label: str, seconds: float, s: dict) -> None:
    g = s["graphs"]
    print(f"{label:<22} {seconds:8.1f} s  points {s['points']} ({s['points_cached']} cached, "
          f"{s['points_invalid']} invalid)  plans {sum(s['plans'].values())}  graphs {sum(g.values())} "
          f"(train {g['train']}, val {g['val']}, test {g['test']})  nodes/graph median "
          f"{s['nodes_per_graph']['median']:g} max {s['nodes_per_graph']['max']}  categories {s['categories']}  "
          f"over --max-nodes {s['graphs_too_large']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="/tmp/stage-bench-dataset")
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "grid.toml").write_text(GRID)

    seconds, s, line = build(root / "local", root / "cache-local", "local", args.workers)
    report(f"local ({args.workers} workers)", seconds, s)
    with open(root / "local" / "index.csv") as f:
        models = sorted({r["model"] for r in csv.DictReader(f)})
    print(f"{'':<22} families: {', '.join(models)}; {line}")
    seconds, s, _ = build(root / "local-again", root / "cache-local", "local", args.workers)
    report("local, from the cache", seconds, s)
    print(f"{'':<22} same files as the first run: {same_files(root / 'local', root / 'local-again')}")
    if args.no_ray:
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        print("ray: not installed (pip install 'plugins/stage-executor-ray[ray]')")
        return
    seconds, s, _ = build(root / "ray", root / "cache-ray", "ray", args.workers)
    report("ray (local instance)", seconds, s)
    print(f"{'':<22} same files as the local run: {same_files(root / 'local', root / 'ray')}")


if __name__ == "__main__":
    main()
