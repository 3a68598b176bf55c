"""How long `stage generate` takes on the default job (gpt-tiny, dp 8), end to end and by phase, and how
long the largest presets take to build.

    python benchmarks/bench_generate.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

from _timing import time_generate

from stage_core.api import DEFAULT_MODEL, DEFAULT_PLAN
from stage_core.plugins import PluginHost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    host = PluginHost()
    runs = [time_generate(host, DEFAULT_MODEL, DEFAULT_PLAN) for _ in range(args.repeat)]
    r = runs[-1]
    print(f"default job: {DEFAULT_MODEL}, dp {DEFAULT_PLAN.dp}: {r['ranks']} ranks, {r['nodes']:,} nodes, "
          f"{r['bytes']:,} bytes")
    for key in ("plan_s", "write_s", "validate_s", "total_s"):
        values = [x[key] for x in runs]
        print(f"  {key:<11} median {statistics.median(values) * 1e3:8.1f} ms   min {min(values) * 1e3:8.1f} ms")
    # the largest presets' single-device graphs (the model plugins' build step alone)
    for spec in host.models():
        for name in ("megatron-1t", "deepseek-v3", "llama3-405b"):
            if name in spec.presets:
                times = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    spec.build(spec.presets[name])
                    times.append(time.perf_counter() - t)
                print(f"  build {name:<12} median {statistics.median(times) * 1e3:8.1f} ms   "
                      f"min {min(times) * 1e3:8.1f} ms")
    # the command as a user runs it, interpreter start-up and plugin discovery included
    with tempfile.TemporaryDirectory() as d:
        walls = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "stage_core.cli", "generate", "-o", f"{d}/traces"], check=True,
                           capture_output=True)
            walls.append(time.perf_counter() - t)
    print(f"  `stage generate` wall clock: median {statistics.median(walls):.2f} s, min {min(walls):.2f} s")


if __name__ == "__main__":
    main()
