"""`stage estimate` against the real simulator on a corpus of plans: dense and MoE, pipelined
(1F1B, interleaved, GPipe, uneven stages), ZeRO 1/2/3, recompute, context parallel.

Each plan is lowered with --gpu (its compute timed by the GPU's compute model), estimated
(the replay of `stage_search.estimate`), written and run through ASTRA-sim (the
`astrasim` simulator of the stage_simulators hook).  Prints per plan the estimate, the
simulated step and the error, then the median and worst error and the Spearman rank
correlation of the estimates with the simulated steps.

Run: ``ASTRA_SIM_BIN=... python benchmarks/bench_estimate.py [--only N,M] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from stage_core import hardware
from stage_core.api import plan_job, write_trace_set
from stage_core.cli import build_parser, plan_from_args
from stage_core.plugins import PluginHost
from stage_search.estimate import estimate_job

L8 = "--model llama3-8b --seq-len 2048"
L70 = "--model llama3-70b --seq-len 4096"
G175 = "--model gpt3-175b --gpu a100"
MIX = "--model mixtral-8x7b --seq-len 2048"

#: (kind, flags); models cut to a few layers (--set layers=N) so that every set simulates in minutes here
CORPUS = [
    ("dense", f"{L8} --set layers=8 --tp 2 --pp 2 --dp 2 --micro-batches 8"),
    ("dense", f"{L8} --set layers=8 --tp 4 --pp 2 --dp 4 --sp --micro-batches 8 --seq-len 4096"),
    ("dense", f"{L8} --set layers=8 --tp 8 --dp 4 --sp --micro-batches 4 --seq-len 4096"),
    ("dense", f"{L8} --set layers=4 --dp 16 --micro-batches 2"),
    ("zero", f"{L8} --set layers=8 --tp 2 --dp 8 --zero 1 --micro-batches 4"),
    ("zero", f"{L8} --set layers=8 --tp 2 --dp 8 --zero 2 --micro-batches 4"),
    ("zero", f"{L8} --set layers=8 --tp 2 --dp 8 --zero 3 --micro-batches 4"),
    ("zero", f"{L8} --set layers=4 --dp 16 --zero 3 --micro-batches 2"),
    ("pipelined", f"{L70} --set layers=8 --tp 8 --pp 4 --dp 2 --sp --micro-batches 8"),
    ("pipelined", f"{L70} --set layers=16 --tp 8 --pp 4 --dp 2 --sp --micro-batches 8 --schedule interleaved "
                  "--virtual-stages 2"),
    ("pipelined", f"{L70} --set layers=8 --tp 4 --pp 2 --dp 4 --sp --micro-batches 8 --recompute full"),
    ("zero", f"{L70} --set layers=8 --tp 8 --pp 2 --dp 4 --sp --micro-batches 8 --recompute selective --zero 1"),
    ("pipelined", f"{G175} --set layers=8 --tp 8 --pp 4 --dp 2 --micro-batches 8"),
    ("pipelined", f"{G175} --set layers=16 --tp 8 --pp 8 --dp 2 --micro-batches 16 --schedule interleaved "
                  "--virtual-stages 2 --recompute full"),
    ("dense", f"{G175} --set layers=8 --tp 4 --pp 2 --dp 8 --sp --micro-batches 8"),
    ("dense", f"{L8} --set layers=8 --tp 2 --cp 2 --pp 2 --dp 2 --micro-batches 4 --seq-len 8192"),
    ("dense", f"{L8} --set layers=4 --tp 2 --cp 4 --dp 2 --micro-batches 2 --seq-len 8192 --cp-comm all-gather"),
    ("dense", f"{L8} --set layers=4 --cp 4 --dp 4 --micro-batches 2 --seq-len 8192 --cp-comm a2a"),
    ("pipelined", f"{L8} --set layers=8 --pp 8 --dp 2 --micro-batches 16 --schedule gpipe"),
    ("pipelined", f"{L8} --set layers=18 --tp 2 --pp 4 --dp 2 --micro-batches 16 --stage-layers auto"),
    ("dense", "--model gpt2-large --tp 2 --pp 2 --dp 4 --micro-batches 8 --seq-len 1024"),
    ("zero", "--model qwen2.5-7b --set layers=8 --tp 4 --pp 2 --dp 4 --sp --micro-batches 8 --zero 2 --seq-len 4096"),
    ("moe", f"{MIX} --set layers=4 --tp 2 --ep 4 --dp 4 --sp --micro-batches 4"),
    ("moe", f"{MIX} --set layers=4 --ep 8 --dp 8 --micro-batches 4"),
    ("moe", f"{MIX} --set layers=8 --tp 2 --ep 4 --dp 4 --pp 2 --sp --micro-batches 8"),
    ("moe", f"{MIX} --set layers=4 --tp 2 --ep 2 --dp 4 --sp --zero 1 --micro-batches 4 --moe-dispatcher allgather"),
    ("moe", f"{MIX} --set layers=4 --tp 2 --ep 4 --etp 1 --dp 4 --sp --micro-batches 4"),
    ("moe", f"{MIX} --set layers=4 --tp 2 --ep 4 --dp 4 --sp --zero 3 --micro-batches 4"),
    ("moe", "--model qwen3-235b-a22b --set layers=4 --tp 4 --ep 8 --dp 8 --sp --micro-batches 4 --seq-len 2048"),
    ("moe", "--model deepseek-v3 --set layers=4 --tp 2 --ep 8 --dp 8 --pp 2 --sp --micro-batches 8 --seq-len 2048"),
    ("pipelined", f"{L8} --set layers=16 --tp 8 --pp 4 --dp 8 --sp --micro-batches 8"),
    ("pipelined", f"{G175} --set layers=8 --tp 8 --pp 8 --dp 4 --micro-batches 16"),
    ("zero", f"{L70} --set layers=4 --tp 8 --pp 2 --dp 16 --sp --zero 1 --micro-batches 4"),
    ("moe", f"{MIX} --set layers=8 --tp 2 --ep 8 --dp 8 --pp 2 --sp --micro-batches 8 --zero 1"),
]


def spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in np.unique(x):  # ties share their mean rank
            r[x == v] = r[x == v].mean()
        return r
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def run_one(host, parser, flags: str, simulator) -> dict:
    args = parser.parse_args(["report", *flags.split()])
    model, overrides, plan, _ = plan_from_args(args, host)
    hw = hardware.resolve(host, args.gpu or "h100")
    start = time.perf_counter()
    result = plan_job(host, model, overrides, plan, hw)
    est = estimate_job(result.job, hw)
    estimated = time.perf_counter() - start
    tmp = Path(tempfile.mkdtemp(prefix="stage-bench-estimate-"))
    try:
        write_trace_set(host, result, tmp / "set")
        start = time.perf_counter()
        sim = simulator.simulate(tmp / "set", None)
        simulated = time.perf_counter() - start
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not sim["finished"]:
        raise RuntimeError(f"{flags}: ranks did not finish in the simulator")
    nodes = sum(len(p.nodes) * len(p.ranks) for p in result.job.programs)
    return {"flags": flags, "world": result.job.world_size, "nodes": nodes, "estimate_s": est.step_time_s,
            "simulated_s": sim["step_time_s"], "error": (est.step_time_s - sim["step_time_s"]) / sim["step_time_s"],
            "seconds_estimate": estimated, "seconds_simulate": simulated}


def astrasim_or_none(host, name: str = "astrasim"):
    """An ASTRA-sim simulator of the stage_simulators hook (``astrasim``, ``astrasim-aware``,
    ``astrasim-htsim``), or None (and why, on stderr)."""
    simulator = host.simulator(name)
    reason = simulator.available()
    if reason:
        print(f"cannot run the simulator: {reason}", file=sys.stderr)
        return None
    return simulator


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated corpus indices (0-based)")
    ap.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    args = ap.parse_args(argv)
    host = PluginHost()
    simulator = astrasim_or_none(host)
    if simulator is None:
        return 2
    parser = build_parser(host)
    chosen = range(len(CORPUS)) if not args.only else [int(i) for i in args.only.split(",")]
    rows = []
    print(f"{'#':>2} {'kind':<9} {'world':>5} {'nodes':>10} {'estimate ms':>12} {'simulated ms':>13} {'error':>8} "
          f"{'est s':>6} {'sim s':>7}  plan")
    for i in chosen:
        kind, flags = CORPUS[i]
        row = {"index": i, "kind": kind, **run_one(host, parser, flags, simulator)}
        rows.append(row)
        print(f"{i:>2} {kind:<9} {row['world']:>5} {row['nodes']:>10,} {row['estimate_s'] * 1e3:>12.3f} "
              f"{row['simulated_s'] * 1e3:>13.3f} {100 * row['error']:>7.3f}% {row['seconds_estimate']:>6.1f} "
              f"{row['seconds_simulate']:>7.1f}  {flags}", flush=True)
    errors = [abs(r["error"]) for r in rows]
    kinds = sorted({r["kind"] for r in rows})
    counts = ", ".join(f"{k} {sum(r['kind'] == k for r in rows)}" for k in kinds)
    print(f"\n{len(rows)} plans ({counts})")
    print(f"median |error| {100 * statistics.median(errors):.4f}%   worst |error| {100 * max(errors):.4f}%")
    if len(rows) > 2:
        print(f"Spearman rank correlation {spearman([r['estimate_s'] for r in rows], [r['simulated_s'] for r in rows]):.4f}")
    print(f"time: estimate {sum(r['seconds_estimate'] for r in rows):.1f} s, "
          f"simulate {sum(r['seconds_simulate'] for r in rows):.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
