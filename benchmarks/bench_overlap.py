"""Megatron's overlap in the one communication slot, measured on issue 12's example.

A 32-layer Llama-2-70B-shaped model at tp8 pp4 dp16 (512 H100s), one micro-batch of
4096 tokens, timed on the h100 preset (calibrated compute model), run in the real
ASTRA-sim.  The first stage's exposed communication (ASTRA-sim's: finish minus
compute) is compared with a hand estimate of the overlapped schedule, built from the
pieces the simulator itself timed (each stage's forward and backward compute, each
TP all-reduce, each pipeline send, the first stage's data-parallel reduction):

    step = sum over stages of (forward + backward compute)     one micro-batch: in series
         + sum over stages of the TP all-reduces               they block the next kernel
         + 6 pipeline hops                                     3 forward, 3 backward
         + stage 0's DP reduction not hidden by its backward   (Megatron's own stream)
         + stage 0's optimizer
    exposed = step - stage 0's compute

Run: ``ASTRA_SIM_BIN=... python benchmarks/bench_overlap.py [OUT_DIR]`` (about 2 min).
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from pathlib import Path

from stage_core import hardware
from stage_core.api import plan_job, write_trace_set
from stage_core.parallel import Plan
from stage_core.plugins import PluginHost
from stage_adapter_astrasim.command import run_astrasim

MODEL, OVERRIDES = "llama2-70b", {"layers": "32"}
PLAN = Plan(tp=8, pp=4, dp=16, micro_batches=1)


def main() -> None:
    binary = os.environ.get("ASTRA_SIM_BIN")
    if not binary:
        sys.exit("set ASTRA_SIM_BIN to ASTRA-sim's analytical binary")
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="bench-overlap-"))
    host = PluginHost()
    result = plan_job(host, MODEL, OVERRIDES, PLAN, hardware.resolve(host, "h100"))
    write_trace_set(host, result, root / "set")
    out = io.StringIO()
    status = run_astrasim(root / "set", astra_sim=binary, timeline_file=str(root / "timeline.json"), out=out,
                          err=io.StringIO(), as_json=True, host=host)
    assert status == 0, out.getvalue()[-2000:]
    results = json.loads(out.getvalue())
    doc = json.loads((root / "timeline.json").read_text())
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]

    def ms(items):
        return sum(e["dur"] for e in items) / 1e3

    stages = []
    for pid in sorted({e["pid"] for e in events}):
        mine = [e for e in events if e["pid"] == pid]
        compute = [e for e in mine if e["cat"] == "compute"]
        stages.append({
            "forward": ms(e for e in compute if ".fwd." in e["name"]),
            "backward": ms(e for e in compute if ".bwd." in e["name"]),
            "optimizer": ms(e for e in compute if "optimizer" in e["name"]),
            "tp": ms(e for e in mine if e["cat"] == "communication" and "grad_sync" not in e["name"]
                     and ":send:" not in e["name"]),
            "hop": max((e["dur"] / 1e3 for e in mine if ":send:" in e["name"]), default=0.0),
            "dp": ms(e for e in mine if "grad_sync" in e["name"]),
            "compute": ms(compute),
        })
    first = stages[0]
    serial = sum(s["forward"] + s["backward"] + s["tp"] for s in stages) + 6 * first["hop"]
    hidden = first["backward"] + first["tp"] / 2  # stage 0's backward kernels and TP collectives
    tail = max(first["dp"] - hidden, 0.0)
    step = serial + tail + first["optimizer"]
    exposed_hand = step - first["compute"]
    row = results["rank_classes"][0]
    exposed_sim = (row["step_time_ns"] - row["compute_ns"]) / 1e6
    print(f"{MODEL} (32 layers) tp8 pp4 dp16, 1 micro-batch of 4096 tokens, h100 (calibrated)")
    for i, s in enumerate(stages):
        print(f"  stage {i}: forward {s['forward']:.2f} backward {s['backward']:.2f} optimizer {s['optimizer']:.2f} "
              f"TP collectives {s['tp']:.2f} send {s['hop']:.3f} DP reduction {s['dp']:.2f} ms")
    print(f"hand estimate: in series {serial:.2f} + DP tail {first['dp']:.2f} - {hidden:.2f} = {tail:.2f} "
          f"+ optimizer {first['optimizer']:.2f} = step {step:.2f} ms; stage 0 exposed {exposed_hand:.2f} ms")
    print(f"simulated: step {row['step_time_ns'] / 1e6:.2f} ms; stage 0 exposed {exposed_sim:.2f} ms "
          f"(exposed comm {row['exposed_comm_ns'] / 1e6:.2f} + bubble {row['bubble_ns'] / 1e6:.2f}); "
          f"{100 * (exposed_sim / exposed_hand - 1):+.1f}% against the hand estimate")


if __name__ == "__main__":
    main()
