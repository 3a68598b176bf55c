"""Validating a generated 1,024-rank pipelined set, replay included.

The set: ``stage generate --model gpt3-175b --tp 8 --pp 8 --dp 16 --micro-batches 16
--sp`` (8 rank classes, about 8 million nodes, about 0.9 GB of Chakra ET), written into
a temporary folder and deleted afterwards (or ``--dir`` an existing one).  Prints, per
run, the wall and CPU seconds of reading and checking it as ``stage validate`` does,
and the CPU seconds of the replay alone (one process per rank class).

    python benchmarks/bench_validate_set.py [--dir DIR] [--runs N]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from stage_core.api import plan_job, read_trace_set, write_trace_set
from stage_core.parallel import Plan
from stage_core.plugins import PluginHost
from stage_core.validate import examine
from stage_core.validate import verdict as verdict_module

PLAN = Plan(tp=8, pp=8, dp=16, micro_batches=16, sp=True)


def write_set(host: PluginHost, parent: Path) -> Path:
    t0 = time.perf_counter()
    result = plan_job(host, "gpt3-175b", {}, PLAN)
    out = write_trace_set(host, result, parent / "set", validate=False)
    nodes = sum(len(p.nodes) * len(p.ranks) for p in result.job.programs)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {result.job.world_size} ranks, {len(result.job.programs)} classes, "
          f"{nodes:,} nodes, {size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")
    return out


def measure(host: PluginHost, directory: Path) -> None:
    replay_cpu = []
    real = verdict_module.decide

    def timed(*args, **kwargs):
        c0 = time.process_time()
        try:
            return real(*args, **kwargs)
        finally:
            replay_cpu.append(time.process_time() - c0)

    import stage_core.validate as package
    package.decide = timed
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        report = examine(read_trace_set(host, directory))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        package.decide = real
    assert report.problems == [], [str(p) for p in report.problems[:3]]
    v = report.verdict
    print(f"  validate: {wall:.2f} s wall, {cpu:.2f} s CPU; replay {replay_cpu[0]:.2f} s CPU "
          f"({v.processes} processes, {'per class' if v.per_class else 'per rank'}; "
          f"every rank finishes: {v.finishes}, timing-independent: {v.timing_independent})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="an existing set to validate")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    host = PluginHost()
    tmp = None
    try:
        if args.dir is None:
            tmp = Path(tempfile.mkdtemp(prefix="stage-bench-validate-set-"))
            directory = write_set(host, tmp)
        else:
            directory = args.dir
        for _ in range(args.runs):
            measure(host, directory)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
