"""Collective level: every measured NCCL curve against ASTRA-sim's analytical network.

For each table under ``plugins/stage-hardware/data`` (NCCL kernel times measured by
microsoft/vidur on DGX A100 and DGX H100 nodes: all-reduce over 2-16 GPUs in one node and
across nodes, send/recv inside a node and between two), each point is timed as ASTRA-sim's
analytical network times it on the preset (the core's netmodel, equal to the simulator to
the nanosecond; `stage_hardware.links.model_seconds`): a ring over ``ranks_per_node`` GPUs of
each node, crossing nodes between GPUs of one local index, as NCCL's rings do; a group of
every GPU of several nodes is ASTRA-sim's whole-world collective.  Per curve: the median and worst
error (model / measured - 1) from 64 KiB, and the median per size band, for the preset
(links fitted to these tables) and the ``*-calibrated`` preset (links from datasheets).

Run: ``python benchmarks/bench_collectives.py [--points]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from stage_core.api import PluginHost
from stage_hardware import tables
from stage_hardware.links import model_seconds

DATA = Path(__file__).parents[1] / "plugins" / "stage-hardware" / "data"
BANDS = ((64 << 10, 1 << 20, "64K-1M"), (1 << 20, 16 << 20, "1M-16M"), (16 << 20, 1 << 40, "16M+"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", action="store_true", help="print every point")
    ap.add_argument("--from-bytes", type=int, default=64 << 10, help="the smallest size counted (64 KiB)")
    args = ap.parse_args()
    host = PluginHost()
    for gpu in ("a100", "h100"):
        points = [p for p in tables.read_collectives(DATA / f"{gpu}-collectives.csv") if p.bytes >= args.from_bytes]
        print(f"\n{gpu}-collectives.csv: {len(points)} measured points from {args.from_bytes >> 10} KiB")
        print(f"  {'curve':<28} {'preset':<16} {'median |err|':>12} {'worst':>9}  "
              + "  ".join(f"{b[2]:>8}" for b in BANDS))
        curves: dict[tuple, list] = {}
        for p in points:
            curves.setdefault((p.op, p.ranks, p.ranks_per_node), []).append(p)
        everything = {}
        for preset in (gpu, f"{gpu}-calibrated"):
            hw = host.hardware_preset(preset)
            for (op, ranks, per), mine in sorted(curves.items()):
                errors = [(p, model_seconds(hw, p) / p.seconds - 1) for p in mine]
                everything.setdefault(preset, []).extend(e for _, e in errors)
                where = "one node" if ranks == per else f"{ranks // per} nodes"
                bands = []
                for lo, hi, _ in BANDS:
                    band = [abs(e) for p, e in errors if lo <= p.bytes < hi]
                    bands.append(f"{100 * statistics.median(band):>7.1f}%" if band else f"{'-':>8}")
                worst = max((e for _, e in errors), key=abs)
                label = f"{op} {ranks} GPUs, {where}"
                print(f"  {label:<28} {preset:<16} {100 * statistics.median(abs(e) for _, e in errors):>11.1f}% "
                      f"{100 * worst:>+8.1f}%  " + "  ".join(bands))
                if args.points and preset == gpu:
                    for p, e in errors:
                        print(f"      {p.bytes:>12,} B  measured {p.seconds * 1e6:>9.1f} us  model "
                              f"{(1 + e) * p.seconds * 1e6:>9.1f} us  {100 * e:+6.1f}%")
        for preset, errors in everything.items():
            print(f"  all curves, {preset}: median |err| {100 * statistics.median(map(abs, errors)):.1f}%, "
                  f"worst {100 * max(errors, key=abs):+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
