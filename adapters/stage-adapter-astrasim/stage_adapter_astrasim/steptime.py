"""Per rank class: the step time, what it is made of, and the throughput it means.

Throughput follows Megatron-LM's FLOP convention (``num_floating_point_operations``
in ``megatron/training/training.py``): a step's *model FLOPs* are the forward and
backward matmul FLOPs, 3x the forward's, with activation recompute not counted
(the manifest's ``flops.model``, per rank).  *Hardware FLOPs* are every matmul FLOP
the traces run, recompute included: with full recompute, what Narayanan et al. 2021
count in their Table 1.  Per GPU: a rank's FLOPs over the step time, the time the
slowest rank finishes.  MFU: model FLOPs per second over the GPU's dense BF16 peak.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .parser import RankResult
from .report import rank_ranges
from .timeline import Span, breakdown

CONVENTION = ("model FLOPs as Megatron-LM counts them (num_floating_point_operations): 3 x the forward "
              "matmuls, recompute not counted; hardware FLOPs: every matmul run, recompute included")
INFERENCE_CONVENTION = ("model FLOPs of inference (prefill, decode, serve): the forward matmuls once; hardware "
                        "FLOPs: every matmul run")


def class_results(manifest: Mapping[str, Any], ranks: Mapping[int, RankResult],
                  spans: Mapping[int, Sequence[Span]] | None, peak_flops: float | None) -> list[dict]:
    """One row per rank class of the manifest (ns, FLOPs per second per GPU)."""
    finished = [r.finish_time_ns for r in ranks.values() if r.finished]
    step = max(finished, default=None)
    rows = []
    for rc in manifest.get("rank_classes", []):
        members = [ranks[r] for r in rc["ranks"] if r in ranks and ranks[r].finished]
        if not members:
            continue
        first = rc["ranks"][0]
        row: dict[str, Any] = {"ranks": rank_ranges(rc["ranks"]), "shown_rank": first,
                               "step_time_ns": max(m.finish_time_ns for m in members)}
        if spans and first in spans and first in ranks and ranks[first].finished:
            row.update(breakdown(spans[first], ranks[first].finish_time_ns))
        elif first in ranks:
            res = ranks[first]
            row.update(compute_ns=res.stats.get("gpu_time_ns"), exposed_comm_ns=res.exposed_comm_ns,
                       bubble_ns=None)  # ASTRA-sim's exposed communication includes the bubble
        flops = rc.get("flops", {})
        if step:
            for key, name in (("model", "model_tflops_per_gpu"), ("matmul", "hardware_tflops_per_gpu")):
                if key in flops:
                    row[name] = flops[key] / (step * 1e-9) / 1e12
            if peak_flops and "model_tflops_per_gpu" in row:
                row["mfu"] = row["model_tflops_per_gpu"] * 1e12 / peak_flops
        rows.append(row)
    return rows


def job_results(manifest: Mapping[str, Any], step_ns: int | None, peak_flops: float | None) -> dict:
    """The job's model and hardware TFLOP/s per GPU and MFU."""
    classes = manifest.get("rank_classes", [])
    world = manifest.get("world_size")
    if not step_ns or not world or not classes or "model" not in classes[0].get("flops", {}):
        return {}
    model = sum(rc["flops"]["model"] * len(rc["ranks"]) for rc in classes)
    matmul = sum(rc["flops"]["matmul"] * len(rc["ranks"]) for rc in classes)
    inference = manifest.get("plan", {}).get("task", "train") != "train"
    out = {"flop_convention": INFERENCE_CONVENTION if inference else CONVENTION,
           "model_tflops_per_gpu": model / world / (step_ns * 1e-9) / 1e12,
           "hardware_tflops_per_gpu": matmul / world / (step_ns * 1e-9) / 1e12}
    if peak_flops:
        out["peak_tflops"] = peak_flops / 1e12
        out["mfu"] = out["model_tflops_per_gpu"] * 1e12 / peak_flops
    return out


def _ms(value) -> str:
    return "-" if value is None else f"{value / 1e6:,.3f}"


def format_classes(rows: Sequence[Mapping[str, Any]], job: Mapping[str, Any]) -> str:
    """The per-class table and the job's throughput line."""
    header = ["rank class", "step ms", "compute ms", "exposed comm ms", "bubble ms", "model TFLOP/s/GPU", "MFU"]
    body = []
    for row in rows:
        tflops = row.get("model_tflops_per_gpu")
        mfu = row.get("mfu")
        body.append([row["ranks"], _ms(row["step_time_ns"]), _ms(row.get("compute_ns")),
                     _ms(row.get("exposed_comm_ns")), _ms(row.get("bubble_ns")),
                     "-" if tflops is None else f"{tflops:,.1f}", "-" if mfu is None else f"{100 * mfu:.1f}%"])
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
    lines = ["  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))
             for r in [header] + body]
    if job:
        line = (f"model TFLOP/s per GPU {job['model_tflops_per_gpu']:,.1f}"
                + (f", MFU {100 * job['mfu']:.1f}% of {job['peak_tflops']:,.1f} TFLOPS" if "mfu" in job else "")
                + f"; hardware TFLOP/s per GPU {job['hardware_tflops_per_gpu']:,.1f}")
        lines += [line, f"({job['flop_convention']})"]
    if any(r.get("bubble_ns") is None for r in rows):
        lines.append("(no per-node log: exposed comm is ASTRA-sim's, waiting on receives included; "
                     "no bubble column)")
    return "\n".join(lines)
