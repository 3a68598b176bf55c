"""How long `stage models` takes: the first run (every preset's parameters counted, its cache
empty) and the next ones (the counts read back), against `stage plugins` (loading the plugins
and nothing else) and `python -c pass`; each as a user runs it, a fresh process.

    python benchmarks/bench_models.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def seconds(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed: {done.stderr.strip()[-300:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    stage = shutil.which("stage") or str(Path(sys.executable).parent / "stage")
    cache = Path(tempfile.mkdtemp(prefix="stage-bench-models-"))
    env = dict(os.environ, STAGE_CACHE_DIR=str(cache), STAGE_PROGRESS="off")
    try:
        cold = []
        for _ in range(max(1, args.repeat // 2)):
            for f in cache.iterdir():
                f.unlink()
            cold.append(seconds([stage, "models"], env))
        warm = [seconds([stage, "models"], env) for _ in range(args.repeat)]
        plugins = [seconds([stage, "plugins"], env) for _ in range(args.repeat)]
        python = [seconds([sys.executable, "-c", "pass"], env) for _ in range(args.repeat)]
        off = [seconds([stage, "models"], dict(env, STAGE_CACHE_DIR="off")) for _ in range(max(1, args.repeat // 2))]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    rows = [("stage models, first run (counts every preset)", cold),
            ("stage models, counts kept (the usual run)", warm),
            ("stage models, STAGE_CACHE_DIR=off (counts every time)", off),
            ("stage plugins (loading the plugins only)", plugins),
            ("python -c pass", python)]
    print(f"{'':<56} {'median s':>9} {'min s':>7} {'max s':>7}  (runs)")
    for label, times in rows:
        print(f"{label:<56} {statistics.median(times):>9.2f} {min(times):>7.2f} {max(times):>7.2f}  ({len(times)})")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
