"""Confirm a search's ranking in the real simulator, on a scaled-down equivalent when the
cluster is too large to simulate here.

Reads the JSON of ``stage search ... --json`` (its best plans, and the ``--compare`` plan),
divides every plan's data-parallel degree by ``--scale`` (the global batch with it, so
each replica keeps its micro-batches: every rank runs the very same steps, tensor,
context and pipeline communication unchanged; only the data-parallel groups are smaller),
and for each plan prints the replay's estimate and ASTRA-sim's step.  The plans' order
by the simulator is the confirmation.

Run: ``ASTRA_SIM_BIN=... python benchmarks/bench_confirm.py search.json --model llama3-405b --gpu h100
--scale 64 [--top 5]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from stage_core import hardware
from stage_core.api import plan_job, write_trace_set
from stage_core.cli import build_parser, plan_from_args
from stage_core.plugins import PluginHost
from stage_search.estimate import estimate_job
from stage_search.search import plan_text

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_estimate import astrasim_or_none, spearman  # noqa: E402


def scaled(flags: list[str], scale: int) -> list[str]:
    """``flags`` with --dp divided by ``scale`` (it must divide)."""
    out = list(flags)
    i = out.index("--dp")
    dp = int(out[i + 1])
    if dp % scale:
        raise SystemExit(f"--scale {scale} does not divide dp {dp} of {' '.join(flags)}")
    out[i + 1] = str(dp // scale)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("search_json")
    ap.add_argument("--model", required=True)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--scale", type=int, default=1, help="divide every plan's dp by this")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--simulator", default="astrasim",
                    help="astrasim (analytical), astrasim-aware or astrasim-htsim (one node, under 3 s of step)")
    args = ap.parse_args(argv)
    table = json.loads(Path(args.search_json).read_text())
    entries = [("#%d" % (i + 1), e) for i, e in enumerate(table["plans"][:args.top])]
    if "compare" in table:
        entries.append((f"{table['compare']['name']} (#{table['compare']['rank']})", table["compare"]))
    host = PluginHost()
    hw = hardware.resolve(host, args.gpu)
    simulator = astrasim_or_none(host, args.simulator)
    if simulator is None:
        return 2
    parser = build_parser(host)
    rows = []
    print(f"{args.model} on {table['gpus']:,} {hw.name}, dp divided by {args.scale}: "
          f"{table['gpus'] // args.scale:,} GPUs simulated per plan")
    for label, e in entries:
        flags = scaled(e["plan"], args.scale)
        model, overrides, plan, _ = plan_from_args(parser.parse_args(["report", "--model", args.model, *flags]),
                                                   host)
        start = time.perf_counter()
        result = plan_job(host, model, overrides, plan, hw)
        est = estimate_job(result.job, hw).step_time_s
        nodes = sum(len(p.nodes) * len(p.ranks) for p in result.job.programs)
        tmp = Path(tempfile.mkdtemp(prefix="stage-confirm-"))
        try:
            write_trace_set(host, result, tmp / "set", validate=False)
            sim = simulator.simulate(tmp / "set", hw)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        seconds = time.perf_counter() - start
        rows.append((label, plan, e["step_time_s"], est, sim["step_time_s"], sim["finished"]))
        print(f"{label:<28} {plan_text(plan):<46} full-size estimate {e['step_time_s'] * 1e3:9.1f} ms | scaled: "
              f"estimate {est * 1e3:9.1f} ms, ASTRA-sim {sim['step_time_s'] * 1e3:9.1f} ms "
              f"({'every rank finished' if sim['finished'] else 'NOT FINISHED'}; {nodes:,} nodes, {seconds:.0f} s)",
              flush=True)
    if len(rows) > 2:
        print(f"Spearman of the scaled estimates and ASTRA-sim: {spearman([r[3] for r in rows], [r[4] for r in rows]):.4f}")
    best = min(rows, key=lambda r: r[4])
    print(f"fastest in ASTRA-sim: {best[0]} {plan_text(best[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
