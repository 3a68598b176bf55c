"""Pipeline schedules in ASTRA-sim: 1F1B against the zero-bubble schedules and DualPipeV, and
1F1B, DualPipeV and DualPipe on a DeepSeek-V3-shaped MoE.

For each model shape and (pp, micro-batches): every schedule's set is written timed on the
GPU (--gpu), run in the real simulator (ASTRA_SIM_BIN or --astra-sim), and compared:

* step: the simulator's (slowest rank's finish);
* T_F, T_B, T_W: one micro-batch's forward, input-gradient backward and weight-gradient
  time on the busiest stage, from the written kernels' durations (ZB-H1's split set); the
  published formulas assume every stage takes these (the head and embedding make the
  first and last stages differ);
* bubble, simulated: the step minus the busiest stage's kernel time; and the paper's formula
  for the same p, m and times (Qi et al. 2024 Table; the DualPipe README);
* peak activation memory (the manifest's, busiest stage) and pipeline bytes per stage.

DeepSeek (printed after, or alone with --deepseek): DeepSeek-V3 cut to 8 layers (the first
dense), pp 4, dp 2, experts over dp (ep 2), 1,024 tokens a micro-batch, 8 and 16 micro-
batches, 1F1B, DualPipeV and DualPipe, run with the simulator's node log (``stage astrasim
--timeline``): the step; when the last micro-batch step ends (the pipeline, before the
gradient sync and the optimizer); the time an expert all-to-all is in flight while no kernel
runs (per rank shown, the most); the parameters of the largest rank.

    python benchmarks/bench_schedules.py [--astra-sim BIN] [--gpu h100] [--quick] [--deepseek]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from stage_core.api import (Plan, PluginHost, hardware, netmodel, plan_from_settings, plan_job, simulate_order,
                            write_trace_set)

#: Llama 3 8B's layers with Llama 2's vocabulary, and Megatron's 1.7B GPT: 8 and 6 layers a stage at pp 4, so the
#: head and the embedding weigh little beside a stage's layers (the formulas assume equal stages)
SHAPES = {"llama": ("llama3-8b", {"seq_len": "4096", "vocab_size": "32000"}),
          "gpt": ("megatron-1.7b", {})}
#: layers of each shape's model (32 and 24), for --head-balanced
LAYERS = {"llama3-8b": 32, "megatron-1.7b": 24}
SCHEDULES = ("1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipev", "dualpipe")
#: the DeepSeek comparison: the model, its overrides, the schedules
DEEPSEEK = ("deepseek-v3", {"layers": "8", "first_dense_layers": "1"}, ("1f1b", "dualpipev", "dualpipe"))


def phase_times(result, stage: int | None = None) -> tuple[float, float, float]:
    """(T_F, T_B, T_W) in seconds of one micro-batch on ``stage`` (default: the stage with the most kernel
    time): its kernels' durations, from the split set."""
    if stage is None:
        stage = max(range(len(result.job.programs)),
                    key=lambda s: result.manifest["rank_classes"][s]["compute_time_us"])
    nodes = result.job.programs[stage].nodes
    m = result.plan.micro_batches
    total = {"F": 0, "B": 0, "W": 0}
    for n in nodes:
        if n.type != 4 or not n.name.startswith("mb"):  # compute nodes of a micro-batch's steps
            continue
        kind = "W" if re.search(r"\.w\.", n.name) else "F" if ".fwd." in n.name else "B"
        total[kind] += n.duration_micros
    return tuple(total[k] / m * 1e-6 for k in "FBW")


def formula(schedule: str, p: int, m: int, TF: float, TB: float, TW: float) -> float:
    """The published bubble for p stages (chunk times half a stage's for the two-chunk schedules)."""
    if schedule == "1f1b":
        return (p - 1) * (TF + TB + TW)
    if schedule == "zb-h1":
        return (p - 1) * (TF + TB - TW)
    if schedule == "zb-h2":
        return max(0.0, (p - 1) * (TF + TB - 2 * TW))
    if schedule == "dualpipe":  # DeepSeek-V3 report Table 2, PP = p ranks, a chunk a stage's layers
        return (p / 2 - 1) * ((TF + TB + TW) + (TB + TW) - 3 * TW)
    f, b, w = TF / 2, TB / 2, TW / 2
    if schedule == "zb-v":
        return float("nan")  # the paper gives no closed form: 0 when T_F = T_B = T_W
    # DualPipe README: (PP/2 - 1)(F&B + B - 3W), PP = 2p chunks, B a whole backward, F&B the pair (no overlap credit)
    return (p - 1) * ((f + b + w) + (b + w) - 3 * w)


def replayed(result, TF: float, TB: float, TW: float) -> float:
    """The order's own bubble under the papers' cost model with these times (chunk times half a stage's for the
    two-chunk schedules): the most idle time of a stage between its first step and its last."""
    plan = result.plan
    host = PluginHost()
    spec = next(s for s in host.schedules() if s.name == plan.schedule)
    order = spec.order(plan.pp, plan.micro_batches, plan.virtual_stages)
    v = plan.virtual_stages
    return max(simulate_order(order, plan.pp, TF / v, TB / v, TW / v, spec.placement)[1])


def timeline_figures(timeline: Path) -> tuple[float, float]:
    """From ``stage astrasim --timeline``'s trace events: (when the last micro-batch step's node ends, the most
    time an all-to-all is in flight while no kernel runs, over the ranks shown), in seconds."""
    events = json.loads(timeline.read_text())
    events = [e for e in (events["traceEvents"] if isinstance(events, dict) else events) if e.get("ph") == "X"]
    pipeline, exposed = 0.0, 0.0
    for pid in {e["pid"] for e in events}:
        mine = [e for e in events if e["pid"] == pid]
        pipeline = max([pipeline] + [e["ts"] + e["dur"] for e in mine if e["args"].get("name", "").startswith("mb")])
        kernels = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == 1]  # (the compute track)
        a2a = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["cat"] == "all-to-all"]
        exposed = max(exposed, netmodel.step_breakdown(kernels, a2a, 0)[1])
    return pipeline * 1e-6, exposed * 1e-6


def deepseek(host, hw, gpu: str, tmp: str, quick: bool) -> None:
    from stage_adapter_astrasim.command import run_astrasim

    model, sets, schedules = DEEPSEEK
    print("\n| DeepSeek-V3 8 layers, pp 4 dp 2 ep 2 | m | schedule | step ms | last micro-batch step ends ms | "
          "exposed all-to-all ms (most, a rank) | parameters GiB (largest rank) |")
    print("|---|---|---|---|---|---|---|")
    for m in (8,) if quick else (8, 16):
        for schedule in schedules:
            plan = Plan(pp=4, dp=2, ep=2, micro_batches=m, seq_len=1024, schedule=schedule)
            result = plan_job(host, model, sets, plan, hw)
            target = write_trace_set(host, result, Path(tmp) / f"deepseek-{m}-{schedule}")
            timeline = Path(tmp) / f"deepseek-{m}-{schedule}.json"
            out, err = io.StringIO(), io.StringIO()
            status = run_astrasim(target, system=gpu, as_json=True, timeline_file=str(timeline), out=out, err=err)
            summary = json.loads(out.getvalue())["summary"]
            step = summary["max_finish_time_ns"] * 1e-9
            pipeline, exposed = timeline_figures(timeline)
            params = max(rc["memory_bytes"]["parameters"] for rc in result.manifest["rank_classes"]) / 2**30
            print(f"| | {m} | {schedule} | {step * 1e3:.1f} | {pipeline * 1e3:.1f} | {exposed * 1e3:.1f} | "
                  f"{params:.1f} |" + ("" if status == 0 and summary["finished_ranks"] == 8 else " NOT FINISHED"))


def run(args) -> int:
    host = PluginHost()
    sims = [s for s in host.simulators() if s.available() is None]
    if not sims:
        print("no simulator available (set ASTRA_SIM_BIN)", file=sys.stderr)
        return 1
    hw = hardware.resolve(host, args.gpu)
    if args.deepseek:
        with tempfile.TemporaryDirectory() as tmp:
            deepseek(host, hw, args.gpu, tmp, args.quick)
        return 0
    cases = [("llama", 4, 8)] if args.quick else [(s, 4, m) for s in SHAPES for m in (8, 16)]
    print("| shape | pp | m | schedule | step ms | T_F/T_B/T_W ms | bubble ms (sim) | bubble ms (formula) | bubble ms (order "
          "replayed) | "
          "activations GiB (stage 0 / max) | pipeline MB/stage |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for shape, pp, m in cases:
            model, sets = SHAPES[shape]
            rows, times = [], None
            for schedule in SCHEDULES:
                settings = {"model": model, "pp": pp, "micro-batches": m, "schedule": schedule,
                            "set": [f"{k}={v}" for k, v in sets.items()]}
                if args.auto:  # stages balanced by compute, the embedding and the head one layer each
                    settings["stage-layers"] = "auto"
                elif args.head_balanced:  # the last stage one layer fewer (it holds the head), the first one more
                    if next(s for s in host.schedules() if s.name == schedule).placement == "v":  # (chunks 0, 2p-1 on stage 0)
                        rows.append((schedule, None, "not applicable: a V puts the embedding and the head both on "
                                                     "stage 0, so no stage carries the head alone"))
                        continue
                    per = LAYERS[model] // pp
                    settings["stage-layers"] = f"{per + 1},{per}x{pp - 2},{per - 1}"
                req = plan_from_settings(settings, host)
                try:
                    result = plan_job(host, req.model, req.overrides, req.plan, hw)
                except Exception as exc:  # noqa: BLE001 - a schedule that cannot take the case says why
                    rows.append((schedule, None, str(exc)))
                    continue
                target = write_trace_set(host, result, Path(tmp) / f"{shape}-{m}-{schedule}")
                rows.append((schedule, result, sims[0].simulate(target, hw)))
                if schedule == "zb-h1":
                    times = phase_times(result)
            for schedule, result, got in rows:
                if result is None:
                    print(f"| {shape} | {pp} | {m} | {schedule} | - | {got} |")
                    continue
                classes = result.manifest["rank_classes"]
                work = max(rc["compute_time_us"] for rc in classes) * 1e-6
                step = got["step_time_s"]
                acts = (f"{classes[0]['memory_bytes']['activations'] / 2**30:.2f} / "
                        f"{max(rc['memory_bytes']['activations'] for rc in classes) / 2**30:.2f}")
                sends = max(rc["comm_bytes"]["send"] for rc in classes) / 1e6
                tfbw = "/".join(f"{t * 1e3:.2f}" for t in times)
                form = formula(schedule, pp, m, *times) * 1e3
                again = replayed(result, *times) * 1e3
                print(f"| {shape} | {pp} | {m} | {schedule} | {step * 1e3:.2f} | {tfbw} | {(step - work) * 1e3:.2f} | "
                      f"{form:.2f} | {again:.2f} | {acts} | {sends:.1f} |" + ("" if got["finished"] else " NOT FINISHED"))
        deepseek(host, hw, args.gpu, tmp, args.quick)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--astra-sim", help="the analytical binary (default $ASTRA_SIM_BIN)")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--quick", action="store_true", help="one shape, pp 4, m 8")
    parser.add_argument("--deepseek", action="store_true", help="only the DeepSeek-V3 comparison (1F1B, DualPipeV, "
                                                                  "DualPipe)")
    parser.add_argument("--auto", action="store_true", help="--stage-layers auto: stages balanced by compute")
    parser.add_argument("--head-balanced", action="store_true",
                        help="the last stage one layer fewer and the first one more (as Megatron's "
                             "--decoder-last-pipeline-num-layers does for the head): the zero-bubble paper's memory "
                             "bound (every stage p M_B under ZB-H1) assumes equal stages, and the head's deferred "
                             "weight gradients make the last stage the largest otherwise")
    a = parser.parse_args()
    if a.astra_sim:
        os.environ["ASTRA_SIM_BIN"] = a.astra_sim
    sys.exit(run(a))
