"""``stage estimate``: one plan's step time on a GPU and its network, without a simulator."""

from __future__ import annotations

import argparse
import json
import sys
import time

from stage_core.api import (Progress, PluginHost, Result, UsageError, add_gpu_flag, add_plan_flags, add_quiet_flag,
                            hardware, memory_fit, plan_from_args, plan_job, ranks_range, ranks_text,
                            table)
from stage_core.records import HardwareSpec

from .estimate import Estimate, estimate_job

HELP = "a plan's step time on a GPU and its network: the rank-class programs replayed as ASTRA-sim runs them"
DEFAULT_GPU = "h100"


def configure(p: argparse.ArgumentParser) -> None:
    add_plan_flags(p, None)
    add_gpu_flag(p, None, default=DEFAULT_GPU)
    p.add_argument("--system", dest="gpu", help=argparse.SUPPRESS)  # the name `stage astrasim` uses
    p.add_argument("--json", action="store_true", help="print the estimate as JSON (step_time_s, mfu, ...)")
    add_quiet_flag(p)


def run(args: argparse.Namespace) -> int:
    host = getattr(args, "stage_host", None) or PluginHost()
    req = plan_from_args(args, host)
    for note in req.notes:
        print(f"stage: note: {note}", file=sys.stderr)
    model, overrides, plan = req.model, req.overrides, req.plan
    if plan.task == "serve":
        raise UsageError("--task serve: stage estimate times one program per rank class; estimate each side "
                         "(--task prefill, --task decode) on its own")
    hw = hardware.resolve(host, req.gpu or DEFAULT_GPU)
    start = time.perf_counter()
    progress = Progress.for_args(args)
    with progress.phase("planning"):
        result = plan_job(host, model, overrides, plan, hw, max_nodes=args.max_nodes)
    with progress.phase(f"replaying {len(result.job.programs)} rank-class programs"):
        est = estimate_job(result.job, hw)
    summary = summarize(result, est, hw)
    summary["seconds"] = time.perf_counter() - start
    summary["past_time_limits"] = past_time_limits(host, est.step_time_s)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
    return 0


def summarize(result: Result, est: Estimate, hw: HardwareSpec) -> dict:
    """The estimate as plain data: the step, its throughput, and per rank class what it is made of."""
    m = result.manifest
    classes = m["rank_classes"]
    world = m["world_size"]
    step = est.step_time_s
    model_flops = sum(rc["flops"].get("model", 0) * len(rc["ranks"]) for rc in classes)
    matmul_flops = sum(rc["flops"].get("matmul", 0) * len(rc["ranks"]) for rc in classes)
    peak = hw.gpu.peak_flops("bf16")
    tflops = model_flops / world / step / 1e12 if step else 0.0
    rows = []
    for rc, ct in zip(classes, est.classes):
        rows.append({"ranks": len(rc["ranks"]), "first_rank": rc["ranks"][0], "ranks_text": ranks_text(rc["ranks"]),
                     "finish_s": ct.finish_ns * 1e-9,
                     "compute_s": ct.compute_ns * 1e-9, "exposed_comm_s": ct.exposed_comm_ns * 1e-9,
                     "bubble_s": ct.bubble_ns * 1e-9, "memory_bytes": rc["memory_bytes"]["total"]})
    busiest = max(range(len(rows)), key=lambda i: rows[i]["compute_s"])
    return {
        "model": result.config.name, "plan": m["plan"], "world_size": world, "hardware": hw.name,
        "compute_model": m.get("compute_model") or hw.gpu.compute_model,
        "step_time_s": step,
        "model_tflops_per_gpu": tflops,
        "hardware_tflops_per_gpu": matmul_flops / world / step / 1e12 if step else 0.0,
        "mfu": tflops * 1e12 / peak,
        "memory_bytes": max(r["memory_bytes"] for r in rows),
        **({"memory_fit": fit} if (fit := memory_fit(classes, hw)) else {}),
        "exposed_comm_s": rows[busiest]["exposed_comm_s"],
        "estimator": "replay of the rank-class programs under ASTRA-sim's issue rules, analytical network",
        "rank_classes": rows,
    }


def past_time_limits(host: PluginHost, step_s: float) -> list[dict]:
    """The installed simulators that stop before a step of ``step_s`` ends (their
    ``time_limit_s``): the plan's set would never finish in them."""
    return [{"simulator": sim.name, "time_limit_s": sim.time_limit_s} for sim in host.simulators()
            if sim.time_limit_s is not None and step_s > sim.time_limit_s]


def format_summary(s: dict) -> str:
    p = s["plan"]
    degrees = " ".join(f"{a}{p[a]}" for a in ("tp", "cp", "ep", "dp", "pp") if p.get(a, 1) > 1) or "one GPU"
    fit = s.get("memory_fit")
    beside = (f" of the {fit['gpu']}'s {fit['capacity_bytes'] / 2**30:g} GiB ({100 * fit['share']:.0f}%): "
              f"{'fits' if fit['fits'] else 'does NOT fit'}") if fit else ""
    lines = [f"{s['model']}  {degrees}  world {s['world_size']:,}  on {s['hardware']} "
             f"(kernels timed by the {s['compute_model']} compute model)",
             f"step time {s['step_time_s'] * 1e3:,.3f} ms   TFLOP/s per GPU: model {s['model_tflops_per_gpu']:,.1f}, "
             f"hardware {s['hardware_tflops_per_gpu']:,.1f} (recompute included)   MFU {100 * s['mfu']:.1f}%",
             f"memory: up to {s['memory_bytes'] / 2**30:,.2f} GiB per GPU{beside}",
             ""]
    staged = p.get("pp", 1) > 1 and len(s["rank_classes"]) == p["pp"]
    rows = [[str(i) if staged else "", ranks_range(r["ranks_text"]),
             f"{r['finish_s'] * 1e3:,.3f}", f"{r['compute_s'] * 1e3:,.3f}", f"{r['exposed_comm_s'] * 1e3:,.3f}",
             f"{r['bubble_s'] * 1e3:,.3f}", f"{r['memory_bytes'] / 2**30:,.2f}"] for i, r in enumerate(s["rank_classes"])]
    headers = ["stage" if staged else "", "ranks", "finish ms", "compute ms", "exposed comm ms", "bubble ms",
               "memory GiB"]
    if not staged:
        headers, rows = headers[1:], [r[1:] for r in rows]
    lines += table(headers, rows, left=2 if staged else 1)
    lines.append(f"\n({s['estimator']}; {s['seconds']:.2f} s)")
    for sim in s.get("past_time_limits", []):
        lines.append(f"note: simulator {sim['simulator']} runs steps of at most {sim['time_limit_s']:g} s of simulated time: "
                     f"this step ({s['step_time_s']:.4g} s) would not finish in it")
    return "\n".join(lines)
