"""Time to generate GPT-3 175B traces with tp 8 and a growing data-parallel degree
(64 to 1,024 ranks), by phase: planning (graph, autodiff, propagation, lowering),
writing the Chakra files, and reading them back to validate.

    python benchmarks/bench_parallel.py [--max-dp 128] [--no-validate]
"""

from __future__ import annotations

import argparse

from _timing import time_generate

from stage_core.parallel import Plan
from stage_core.plugins import PluginHost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-dp", type=int, default=128)
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--model", default="gpt3-175b")
    args = ap.parse_args()
    host = PluginHost()
    print(f"{args.model}, tp 8, sequence parallel, 1 micro-batch; seconds")
    print(f"{'ranks':>6} {'dp':>4} {'nodes':>12} {'MB':>8} {'plan':>6} {'write':>6} {'validate':>8} {'total':>7}"
          f" {'us/node':>8}")
    dp = 8
    base = None
    while dp <= args.max_dp:
        r = time_generate(host, args.model, Plan(tp=8, dp=dp, sp=True), validate=not args.no_validate)
        per_node = r["total_s"] / r["nodes"] * 1e6
        print(f"{r['ranks']:>6} {dp:>4} {r['nodes']:>12,} {r['bytes'] / 1e6:>8.1f} {r['plan_s']:>6.2f} "
              f"{r['write_s']:>6.2f} {r['validate_s']:>8.2f} {r['total_s']:>7.2f} {per_node:>8.2f}")
        base = base or r
        dp *= 2
    print(f"growth from {base['ranks']} to {r['ranks']} ranks: x{r['total_s'] / base['total_s']:.1f} time "
          f"for x{r['ranks'] / base['ranks']:.0f} ranks")


if __name__ == "__main__":
    main()
