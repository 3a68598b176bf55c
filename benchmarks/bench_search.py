"""How fast `stage search` enumerates and estimates plans: Llama 3 405B on 16,384 H100s,
sequences of 8,192 tokens, global batch 2,048 (the plan space of the issue's example).

Prints, in CPU seconds of this process (one core) and wall seconds:

* enumeration: the plans, each checked by the core and the strategies;
* layer measurement: one probe per layer key (:mod:`stage_search.probe`), shared by
  every plan of the key;
* the fast estimate: memory of every plan, then the step time of those that fit;

and the rates: plans enumerated per second, plans estimated per second (memory and
step, the layers measured), and end to end.  ``--agreement N`` also estimates N of the
plans that fit (spread over the fast ranking) with the full replay and prints the fast
estimate's error against it and the rank correlation.

Run: ``python benchmarks/bench_search.py [--agreement 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from stage_core import hardware
from stage_core.api import plan_job, resolve_model
from stage_core.plugins import PluginHost
from stage_search import probe
from stage_search.estimate import estimate_job
from stage_search.fast import estimate_plans
from stage_search.search import _measure, plan_text
from stage_search.space import enumerate_plans

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_estimate import spearman  # noqa: E402


class Clock:
    def __init__(self):
        self.cpu, self.wall = time.process_time(), time.perf_counter()

    def lap(self) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        out = (cpu - self.cpu, wall - self.wall)
        self.cpu, self.wall = cpu, wall
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-405b")
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--global-batch", type=int, default=2048)
    ap.add_argument("--agreement", type=int, default=0, metavar="N",
                    help="estimate N plans that fit again with the replay and compare")
    args = ap.parse_args(argv)
    host = PluginHost()
    hw = hardware.resolve(host, args.gpu)
    capacity = hw.gpu.memory_gib * 2**30
    clock = Clock()
    spec, config = resolve_model(host, args.model, {})
    forward = spec.build(config)
    layers = len({op.layer for op in forward.ops if op.layer is not None})
    strategies = sorted(host.strategies(), key=lambda s: (s.order, s.name))

    def validate(plan):
        return [p for s in strategies for p in s.validate(forward, plan)]

    space = enumerate_plans(args.gpus, args.global_batch, args.seq_len, layers, gpus_per_node=hw.gpus_per_node,
                            validate=validate)
    enum_cpu, enum_wall = clock.lap()
    orders = {s.name: s.order for s in host.schedules()}
    costs, memory = _measure(host, args.model, {}, space.plans, hw, layers, orders, capacity)
    probe_cpu, probe_wall = clock.lap()
    fits = [p for p, m in zip(space.plans, memory) if m <= capacity]
    fast = estimate_plans(fits, costs, layers, hw, orders.__getitem__)
    fast_cpu, fast_wall = clock.lap()
    n = len(space.plans)
    print(f"{config.name} on {args.gpus:,} {hw.name}, global batch {args.global_batch} x {args.seq_len}")
    print(f"  enumerated {space.enumerated:,} plans, {n:,} valid: {enum_cpu:.2f} s CPU ({enum_wall:.2f} s wall)")
    print(f"  layer keys measured: {len(costs)} in {probe_cpu:.2f} s CPU ({probe_wall:.2f} s wall), "
          f"{1e3 * probe_cpu / max(len(costs), 1):.1f} ms each; memory of all {n:,} plans included")
    print(f"  fast step time of the {len(fits):,} that fit: {fast_cpu:.2f} s CPU ({fast_wall:.2f} s wall)")
    total = enum_cpu + probe_cpu + fast_cpu
    print(f"plans enumerated per second (CPU): {space.enumerated / enum_cpu:,.0f}")
    print(f"plans estimated per second (CPU), layers measured: {n / fast_cpu:,.0f} "
          f"(memory of {n:,}, step of {len(fits):,})")
    print(f"plans per second end to end (CPU: enumerate, measure the layers, estimate): {n / total:,.0f} "
          f"({total:.2f} s CPU, {enum_wall + probe_wall + fast_wall:.2f} s wall)")
    if args.agreement:
        order = np.argsort(fast.step_ns)
        picks = order[np.linspace(0, len(order) - 1, args.agreement).astype(int)]
        rows = []
        for i in picks:
            plan = fits[i]
            result = plan_job(host, args.model, {}, plan, hw)
            replay = estimate_job(result.job, hw).step_ns
            rows.append((fast.step_ns[i], replay))
            print(f"  {plan_text(plan):<48} fast {fast.step_ns[i] / 1e6:10.1f} ms  replay {replay / 1e6:10.1f} ms  "
                  f"{100 * (fast.step_ns[i] - replay) / replay:+6.2f}%", flush=True)
        errors = [abs(f - r) / r for f, r in rows]
        print(f"fast against replay on {len(rows)} plans: median |error| {100 * statistics.median(errors):.2f}%, "
              f"worst {100 * max(errors):.2f}%, Spearman {spearman([f for f, _ in rows], [r for _, r in rows]):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
