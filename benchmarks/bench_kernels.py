"""Kernel level: every measured kernel table against the compute models that time it.

For each table under ``plugins/stage-hardware/data`` (CUDA kernel times measured by
microsoft/vidur: GEMMs, elementwise and norm kernels of Llama-shaped layers on A100 and H100,
and the A100's FlashAttention prefill), each kernel is timed by the preset's compute model
(``shaped``, fitted to these tables) and by the ``*-calibrated`` presets' model (one GEMM
efficiency, fitted to a step time): per kernel class, the median and worst error (model /
measured - 1), large GEMMs (10^11 FLOPs and more) apart from small ones; with ``--points``
every kernel.

Run: ``python benchmarks/bench_kernels.py [--points]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from stage_core.api import PluginHost
from stage_hardware import tables
from stage_hardware.calibrate import kernel_class

DATA = Path(__file__).parents[1] / "plugins" / "stage-hardware" / "data"
TABLES = [("a100-kernels.csv", "a100"), ("h100-kernels.csv", "h100"), ("a100-attention.csv", "a100")]


def rows_of(host, points, preset: str):
    hw = host.hardware_preset(preset)
    model = host.compute_model(hw.gpu.compute_model, hw.gpu.name)
    return [(kernel_class(p.kernel), p.name, p.seconds, float(model.time(p.kernel, hw.gpu))) for p in points]


def summary(rows) -> dict[str, tuple[int, float, float, float]]:
    """class -> (points, median |error|, worst error (signed), median signed error)."""
    by: dict[str, list[float]] = {}
    for cls, _, measured, model in rows:
        by.setdefault(cls, []).append(model / measured - 1)
    out = {}
    for cls, errors in sorted(by.items()):
        worst = max(errors, key=abs)
        out[cls] = (len(errors), statistics.median(map(abs, errors)), worst, statistics.median(errors))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", action="store_true", help="print every kernel")
    args = ap.parse_args()
    host = PluginHost()
    for name, gpu in TABLES:
        points = tables.read_kernels(DATA / name)
        print(f"\n{name}: {len(points)} measured kernels")
        print(f"  {'class':<22} {'points':>7}   {'preset':<16} {'median |err|':>12} {'worst':>9} {'bias':>8}")
        for preset in (gpu, f"{gpu}-calibrated"):
            rows = rows_of(host, points, preset)
            for cls, (n, median, worst, bias) in summary(rows).items():
                print(f"  {cls:<22} {n:>7}   {preset:<16} {100 * median:>11.1f}% {100 * worst:>+8.1f}% "
                      f"{100 * bias:>+7.1f}%")
            if args.points and preset == gpu:
                for cls, label, measured, model in rows:
                    print(f"    {label:<60} {cls:<14} measured {measured * 1e6:>10.1f} us  model "
                          f"{model * 1e6:>10.1f} us  {100 * (model / measured - 1):+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
