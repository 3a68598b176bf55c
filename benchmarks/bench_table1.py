"""Narayanan et al. 2021, Table 1 (REFERENCE.md section 8), through the real simulator.

GPT models on A100s, sequence 2048, vocabulary 51,200, full activation recompute,
classic (non-flash) attention as Megatron-LM ran it in 2021, fp16/bf16 gradients reduced
without ZeRO; micro-batch 4 where there is no pipeline, 1 with one (the paper lists no
micro-batch sizes).  Each row: trace-set size, generation and simulation time,
predicted TFLOP/s per GPU (Table 1's convention: every matmul FLOP, recompute
included), the published figure and the error.  Rows are run in order while each
finishes within --limit seconds of simulation.

Run: ``ASTRA_SIM_BIN=... python benchmarks/bench_table1.py [--rows 1-3] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stage_core import hardware
from stage_core.api import plan_job, write_trace_set
from stage_core.parallel import Plan
from stage_core.plugins import PluginHost

# (preset, tp, pp, gpus, global batch, published TFLOP/s per GPU)
TABLE1 = [
    ("megatron-1.7b", 1, 1, 32, 512, 137), ("megatron-3.6b", 2, 1, 64, 512, 138),
    ("megatron-7.5b", 4, 1, 128, 512, 142), ("megatron-18b", 8, 1, 256, 1024, 135),
    ("megatron-39b", 8, 2, 512, 1536, 138), ("megatron-76b", 8, 4, 1024, 1792, 140),
    ("megatron-145b", 8, 8, 1536, 2304, 148), ("megatron-310b", 8, 16, 1920, 2160, 155),
    ("megatron-530b", 8, 35, 2520, 2520, 163), ("megatron-1t", 8, 64, 3072, 3072, 163),
]


def plan(tp, pp, gpus, batch) -> Plan:
    dp = gpus // (tp * pp)
    mbs = 4 if pp == 1 else 1
    return Plan(tp=tp, pp=pp, dp=dp, micro_batch_size=mbs, micro_batches=batch // (dp * mbs), recompute="full")


def run_row(host, gpu, row, out: Path, limit: int) -> dict:
    name, tp, pp, gpus, batch, published = row
    p = plan(tp, pp, gpus, batch)
    start = time.time()
    result = plan_job(host, name, {"attention": "classic"}, p, gpu)
    write_trace_set(host, result, out)
    generated = time.time() - start
    size = sum(f.stat().st_size for f in out.iterdir())
    from stage_adapter_astrasim import command

    buf = io.StringIO()
    start = time.time()
    # no per-node log: only the step time is needed
    status = command.run_astrasim(out, as_json=True, out=buf, err=io.StringIO(), host=host, breakdown=False)
    simulated = time.time() - start
    summary = json.loads(buf.getvalue())["summary"] if status == 0 else {}
    predicted = summary.get("hardware_tflops_per_gpu")
    return {"row": name, "plan": f"tp{tp} pp{pp} dp{p.dp} mbs{p.micro_batch_size}x{p.micro_batches}",
            "nodes": sum(len(q.nodes) * len(q.ranks) for q in result.job.programs), "bytes": size,
            "generate_s": round(generated, 1), "simulate_s": round(simulated, 1), "status": status,
            "predicted": predicted, "published": published,
            "error_pct": None if predicted is None else 100 * (predicted / published - 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1-4", help="1-based rows, e.g. 1-3")
    ap.add_argument("--gpu", default="a100")
    ap.add_argument("--out", default=None)
    ap.add_argument("--limit", type=int, default=600, help="stop after a row simulating longer than this (s)")
    args = ap.parse_args()
    first, _, last = args.rows.partition("-")
    rows = TABLE1[int(first) - 1:int(last or first)]
    host = PluginHost()
    gpu = hardware.resolve(host, args.gpu)
    root = Path(args.out or tempfile.mkdtemp(prefix="table1-"))
    for row in rows:
        out = root / row[0]
        shutil.rmtree(out, ignore_errors=True)
        r = run_row(host, gpu, row, out, args.limit)
        print(json.dumps(r), flush=True)
        shutil.rmtree(out, ignore_errors=True)
        if r["simulate_s"] > args.limit:
            print(f"stopping: {row[0]} simulated in {r['simulate_s']} s, over {args.limit} s", flush=True)
            break


if __name__ == "__main__":
    sys.exit(main())
