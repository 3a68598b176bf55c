"""Step level: published training throughput against `stage estimate` (which equals ASTRA-sim).

Two tables of REFERENCE.md section 8, each row planned as published and estimated by the
replay of `stage estimate` (`stage_search.estimate`), nothing written:

* Narayanan et al. 2021 (SC'21) Table 1: GPT on A100s, sequence 2048, vocabulary 51,200,
  full recompute, classic attention (Megatron-LM in 2021), the pipeline's scatter/gather
  between stages when the plan has the option; micro-batch 4 without a pipeline and 1 with one
  (the paper lists none), 1F1B.  Throughput in the paper's convention:
  96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per step, per GPU and second.
* Llama 3 (arXiv 2407.21783) Table 4: 405B on H100s, the named plans `llama3-405b-8k-gpus`,
  `-16k-gpus` and `-16k-gpus-128k` (model FLOPs per GPU and second, the paper's TFLOPs/GPU).

Only the 1.7B row of Table 1 was ever used to fit anything (the a100's old GEMM efficiency);
every other row, and Llama 3, judges the compute and network models.

Run: ``python benchmarks/bench_steps.py [--rows t1:1-4,l3:1] [--gpu-a100 a100] [--json FILE]``
(the 1T row takes about ten minutes on two cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from stage_core.api import PluginHost, hardware, plan_from_flags, plan_job
from stage_search.estimate import estimate_job

# (preset, heads, h, layers, tp, pp, gpus, global batch, published TFLOP/s per GPU)
TABLE1 = [
    ("megatron-1.7b", 24, 2304, 24, 1, 1, 32, 512, 137), ("megatron-3.6b", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("megatron-7.5b", 32, 4096, 36, 4, 1, 128, 512, 142), ("megatron-18b", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("megatron-39b", 64, 8192, 48, 8, 2, 512, 1536, 138), ("megatron-76b", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("megatron-145b", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("megatron-310b", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("megatron-530b", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("megatron-1t", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
#: (plan, published TFLOP/s per GPU)
TABLE4 = [("llama3-405b-8k-gpus", 430), ("llama3-405b-16k-gpus", 400), ("llama3-405b-16k-gpus-128k", 380)]
SEQ, VOCAB = 2048, 51200


def table1_flags(row, gpu: str, extra: list[str]) -> list[str]:
    name, _, _, _, tp, pp, gpus, batch, _ = row
    dp = gpus // (tp * pp)
    mbs = 4 if pp == 1 else 1
    return ["--model", name, "--set", "attention=classic", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp),
            "--micro-batch-size", str(mbs), "--global-batch", str(batch), "--seq-len", str(SEQ),
            "--recompute", "full", "--gpu", gpu, *extra]


def paper_flops(row) -> float:
    """Table 1's FLOPs per step (recompute counted): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    _, _, h, layers, _, _, _, batch, _ = row
    return 96 * batch * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))


def estimate(host, flags: list[str]) -> tuple[dict, float, float]:
    req = plan_from_flags(flags, host)
    hw = hardware.resolve(host, req.gpu)
    start = time.perf_counter()
    result = plan_job(host, req.model, req.overrides, req.plan, hw, max_nodes=None)
    est = estimate_job(result.job, hw)
    return result.manifest, est.step_time_s, time.perf_counter() - start


def _rows(spec: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for part in spec.split(","):
        table, _, span = part.partition(":")
        first, _, last = span.partition("-")
        size = len(TABLE1) if table == "t1" else len(TABLE4)
        lo = int(first) if first else 1
        hi = int(last) if last else (lo if first else size)
        out.setdefault(table, []).extend(range(lo, hi + 1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="t1:1-10,l3:1-3", help="t1:FIRST-LAST (Table 1), l3:FIRST-LAST (Llama 3)")
    ap.add_argument("--gpu-a100", default="a100", help="the hardware for Table 1 (a preset or file)")
    ap.add_argument("--gpu-h100", default="h100", help="the hardware for Llama 3 (a preset or file)")
    ap.add_argument("--extra", default="", help="flags added to every Table 1 row (e.g. a plan option)")
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    args = ap.parse_args()
    host = PluginHost()
    rows = _rows(args.rows)
    out = []
    extra = args.extra.split()
    print(f"{'row':<28} {'plan':<28} {'step s':>9} {'predicted':>10} {'published':>10} {'error':>8}  (TFLOP/s per GPU)")
    for i in rows.get("t1", []):
        row = TABLE1[i - 1]
        flags = table1_flags(row, args.gpu_a100, extra)
        manifest, step, seconds = estimate(host, flags)
        predicted = paper_flops(row) / step / row[6] / 1e12
        plan = manifest["plan"]
        out.append(_row(f"T1 {row[0]}", f"tp{plan['tp']} pp{plan['pp']} dp{plan['dp']} mbs{plan['micro_batch_size']}"
                        f"x{plan['micro_batches']}", step, predicted, row[8], manifest, seconds))
    for i in rows.get("l3", []):
        name, published = TABLE4[i - 1]
        manifest, step, seconds = estimate(host, ["--plan", name, "--gpu", args.gpu_h100])
        world = manifest["world_size"]
        model = sum(rc["flops"]["model"] * len(rc["ranks"]) for rc in manifest["rank_classes"])
        predicted = model / step / world / 1e12
        plan = manifest["plan"]
        out.append(_row(f"L3 {name}", f"tp{plan['tp']} cp{plan['cp']} pp{plan['pp']} dp{plan['dp']}", step,
                        predicted, published, manifest, seconds))
    errors = [abs(r["error_pct"]) for r in out]
    if errors:
        print(f"\n|error| median {statistics.median(errors):.1f}%  worst {max(errors):.1f}%  over {len(errors)} rows")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def _row(label, plan, step, predicted, published, manifest, seconds) -> dict:
    error = 100 * (predicted / published - 1)
    named = manifest.get("compute_model") or "?"
    hw = (manifest.get("hardware") or {}).get("name", "?")
    print(f"{label:<28} {plan:<28} {step:>9.3f} {predicted:>10.1f} {published:>10} {error:>+7.1f}%  "
          f"[{named} on {hw}; {seconds:.0f} s]", flush=True)
    return {"row": label, "plan": plan, "step_s": step, "predicted": predicted, "published": published,
            "error_pct": error, "compute_model": named, "hardware": hw}


if __name__ == "__main__":
    sys.exit(main())
