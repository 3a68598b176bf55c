"""Llama 3 405B's published plans (REFERENCE.md section 8, Llama 3 Table 4) under `stage estimate`,
one change at a time: what each of the paper's choices (section 3.3.2) moves.

Rows, each on top of the one before: the plan as STAGE ran it before (1F1B, ZeRO-3 resharding
after forward, 7, 8x14, 7 layers); the paper's interleaved schedule with 2 chunks a stage
(3, 4x30, 3: one layer fewer on the first and last); with 8 one-layer chunks (the first the
embedding alone, the last the head alone, as the paper says); FSDP without resharding (the
preset as it is now). Two side rows give the FSDP change alone on 1F1B and on 2 chunks.
Each prints the step, model TFLOP/s per GPU (Megatron's 3 x forward matmuls), MFU, exposed
communication, the busiest rank's memory, and the published TFLOP/s. Nothing is tuned to the
published figure.

Run: ``python benchmarks/bench_llama3.py [--plan llama3-405b-16k-gpus] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

#: Llama 3 Table 4: TFLOP/s per GPU
PUBLISHED = {"llama3-405b-8k-gpus": 430, "llama3-405b-16k-gpus": 400, "llama3-405b-16k-gpus-128k": 380}
BEFORE = ["--schedule", "1f1b", "--virtual-stages", "1", "--stage-layers", "7,8x14,7", "--zero-reshard"]
V2 = ["--schedule", "llama3", "--virtual-stages", "2", "--stage-layers", "3,4x30,3"]
ROWS = [
    ("preset before: 1F1B, ZeRO-3 resharding, 7,8x14,7", BEFORE),
    ("+ Llama 3 schedule, V 2 (3,4x30,3)", V2 + ["--zero-reshard"]),
    ("+ V 8 one-layer chunks (0,1x126,0)", ["--zero-reshard"]),
    ("+ FSDP without resharding (the preset)", []),
    ("(side) 1F1B + FSDP without resharding", BEFORE[:-1] + ["--no-zero-reshard"]),
    ("(side) V 2 + FSDP without resharding", V2 + ["--no-zero-reshard"]),
]


def estimate(plan: str, flags: list[str]) -> dict:
    exe = shutil.which("stage") or "stage"
    got = subprocess.run([exe, "estimate", "--plan", plan, *flags, "--json"], capture_output=True, text=True)
    if got.returncode:
        sys.exit(got.stderr.strip())
    return json.loads(got.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", default="llama3-405b-16k-gpus", choices=sorted(PUBLISHED))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    published = PUBLISHED[args.plan]
    rows, previous = [], None
    print(f"{args.plan}: stage estimate, published {published} TFLOP/s per GPU (Llama 3 Table 4)")
    print(f"{'change':50} {'step s':>8} {'TFLOP/s':>8} {'moved':>7} {'MFU':>6} {'exp.comm s':>10} {'mem GiB':>8} "
          f"{'vs pub.':>8}")
    for label, flags in ROWS:
        e = estimate(args.plan, flags)
        tflops = e["model_tflops_per_gpu"]
        moved = "" if previous is None or label.startswith("(side)") else f"{tflops - previous:+.1f}"
        if not label.startswith("(side)"):
            previous = tflops
        row = {"change": label, "flags": flags, "step_s": e["step_time_s"], "tflops": tflops, "mfu": e["mfu"],
               "exposed_comm_s": e["exposed_comm_s"], "memory_gib": e["memory_bytes"] / 2**30,
               "vs_published_pct": 100 * (tflops / published - 1)}
        rows.append(row)
        print(f"{label:50} {row['step_s']:8.3f} {tflops:8.1f} {moved:>7} {100 * row['mfu']:5.1f}% "
              f"{row['exposed_comm_s']:10.3f} {row['memory_gib']:8.2f} {row['vs_published_pct']:+7.1f}%")
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
