"""Trace sets of 64 to 131,072 ranks: ranks/s, MB/s written and peak memory.

Each configuration runs in a fresh process, the way `stage generate` does: plan,
write every rank's file into a new folder, read the set back and validate it.  The
table gives the phases (seconds), the wall time of the whole process (interpreter
start included) and its CPU seconds (user and system, with the writer and reader
processes: what it costs whatever the machine's load), ranks per second and
microseconds per rank over that wall time,
MB per second over the writing phase, and peak memory: of the main process, and of
the whole process tree (main and writer processes together, sampled every 50 ms).

Suites:
- ``llama405b``: Llama 3 405B, tp8 pp16 (layers per stage ``--stage-layers auto``),
  1F1B, 8 micro-batches, sequence parallel, dp 1, 4, 32, 256 (128 to 32,768 ranks;
  tp8 x pp16 is 128 ranks already, so 64 cannot be);
- ``131k``: the same at dp 1024 (131,072 ranks) with one micro-batch;
- ``prototype``: the published prototype's configuration (32 layers, hidden 8192,
  FFN 28672, 64 heads, 8 KV heads, vocabulary 32000, sequence 1024, tp8 pp4,
  sequence parallel, one micro-batch) from dp 2 to dp 512 (64 to 16,384 ranks).

    python benchmarks/bench_scale.py [--suite llama405b|131k|prototype|all] [--max-ranks N]
        [--out-dir DIR] [--repeat N] [--workers N] [--floor]

``--floor`` also times creating as many empty files in a new folder of ``--out-dir``:
what this machine's file system alone costs.  ``--prototype DIR`` (a checkout of
github astra-sim/stage, with ``--prototype-python``: an interpreter with its
requirements) also runs the prototype's ``main.py`` on each configuration of the
``prototype`` suite, right after STAGE, and prints its wall and CPU seconds and how
many times longer it took.  Sets are deleted after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

LLAMA_405B = {"model": "llama3-405b", "overrides": {}, "plan": {
    "tp": 8, "pp": 16, "sp": True, "micro_batches": 8, "schedule": "1f1b", "stage_layers": "auto"}}
PROTOTYPE = {"model": "llama3-70b", "overrides": {"layers": "32", "vocab_size": "32000"}, "plan": {
    "tp": 8, "pp": 4, "sp": True, "micro_batches": 1, "seq_len": 1024}}
SUITES = {
    "llama405b": [(LLAMA_405B, dp) for dp in (1, 4, 32, 256)],
    "131k": [({**LLAMA_405B, "plan": {**LLAMA_405B["plan"], "micro_batches": 1}}, 1024)],
    "prototype": [(PROTOTYPE, dp) for dp in (2, 4, 8, 16, 32, 64, 128, 256, 512)],
}


# --------------------------------------------------------------------------- one run, in its own process


def run_one(spec: dict, out: Path, workers: int | None) -> dict:
    from stage_core.api import plan_job, write_trace_set
    from stage_core.parallel import Plan
    from stage_core.plugins import PluginHost

    phases: dict[str, float] = {}

    @contextmanager
    def timed(label: str, total: int):
        start = time.perf_counter()
        yield None
        phases[label] = time.perf_counter() - start

    t0 = time.perf_counter()
    host = PluginHost()
    result = plan_job(host, spec["model"], spec["overrides"], Plan(**spec["plan"], dp=spec["dp"]))
    planned = time.perf_counter() - t0
    write_trace_set(host, result, out, "chakra", workers=workers, progress=timed)
    total = time.perf_counter() - t0
    nbytes = sum(e.stat().st_size for e in os.scandir(out))
    return {"ranks": result.job.world_size, "classes": len(result.job.programs),
            "nodes": sum(len(p.nodes) * len(p.ranks) for p in result.job.programs), "bytes": nbytes,
            "plan_s": planned, "write_s": phases["writing"], "validate_s": phases.get("validating", 0.0),
            "total_s": total, "rss_main": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rss_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}


# --------------------------------------------------------------------------- the parent


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (from /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return total


def measure(spec: dict, dp: int, out_dir: Path, workers: int | None) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="stage-bench-scale-", dir=out_dir))
    try:
        job = json.dumps({**spec, "dp": dp})
        cmd = [sys.executable, __file__, "--one", job, "--out", str(folder / "set")]
        if workers:
            cmd += ["--workers", str(workers)]
        load = os.getloadavg()[0]
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        peak = 0
        stop = threading.Event()

        def sample():
            nonlocal peak
            while not stop.wait(0.05):
                peak = max(peak, tree_rss(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        stdout, _ = proc.communicate()
        wall = time.perf_counter() - start
        stop.set()
        sampler.join()
        if proc.returncode:
            raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the run and its workers
        cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
        r = json.loads(stdout.strip().splitlines()[-1])
        r.update(wall_s=wall, cpu_s=cpu, rss_tree=peak, load=(load, os.getloadavg()[0]))
        return r
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_prototype(checkout: Path, python: str, dp: int, out_dir: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of the prototype on the ``prototype`` suite's configuration."""
    folder = Path(tempfile.mkdtemp(prefix="stage-bench-prototype-", dir=out_dir))
    try:
        cmd = [python, "main.py", "--output_dir", str(folder), "--output_name", "workload.%d.et",
               "--dp", str(dp), "--tp", "8", "--pp", "4", "--num_stacks", "32", "--batch", str(dp),
               "--seq", "1024", "--dmodel", "8192", "--dff", "28672", "--head", "64", "--kvhead", "8",
               "--dvocal", "32000"]
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, cwd=checkout, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def create_floor(n: int, out_dir: Path) -> float:
    """Seconds to create ``n`` empty files in a new folder of ``out_dir``."""
    folder = Path(tempfile.mkdtemp(prefix="stage-bench-floor-", dir=out_dir))
    try:
        start = time.perf_counter()
        for i in range(n):
            os.close(os.open(folder / f"f.{i}", os.O_WRONLY | os.O_CREAT, 0o666))
        return time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    ap.add_argument("--max-ranks", type=int, default=None, help="skip larger configurations")
    ap.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()),
                    help="where the sets are written (and deleted); default the temp folder")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workers", type=int, default=None, help="writer processes (default: one per core)")
    ap.add_argument("--floor", action="store_true", help="also time creating as many empty files")
    ap.add_argument("--prototype", type=Path, help="a checkout of github astra-sim/stage to time as well")
    ap.add_argument("--prototype-python", default=sys.executable, help="the interpreter for --prototype")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(json.loads(args.one), args.out, args.workers)))
        return
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    print(f"{os.cpu_count()} cores; sets written under {args.out_dir}; seconds, MB, GB")
    head = (f"{'ranks':>7} {'dp':>5} {'classes':>7} {'nodes':>12} {'MB':>8} {'plan':>6} {'write':>6} "
            f"{'valid':>6} {'wall':>6} {'cpu':>6} {'ranks/s':>8} {'us/rank':>8} {'MB/s':>6} {'RSS':>5} {'tree':>5} "
            f"{'load':>9}" + (f" {'floor':>6}" if args.floor else ""))
    for suite in suites:
        print(f"\n{suite}")
        print(head)
        for spec, dp in SUITES[suite]:
            ranks = dp * spec["plan"]["tp"] * spec["plan"]["pp"]
            if args.max_ranks and ranks > args.max_ranks:
                continue
            for _ in range(args.repeat):
                r = measure(spec, dp, args.out_dir, args.workers)
                mb = r["bytes"] / 1e6
                line = (f"{r['ranks']:>7} {dp:>5} {r['classes']:>7} {r['nodes']:>12,} {mb:>8.0f} "
                        f"{r['plan_s']:>6.2f} {r['write_s']:>6.2f} {r['validate_s']:>6.2f} {r['wall_s']:>6.2f} {r['cpu_s']:>6.1f} "
                        f"{r['ranks'] / r['wall_s']:>8.0f} {r['wall_s'] / r['ranks'] * 1e6:>8.0f} "
                        f"{mb / r['write_s']:>6.0f} {r['rss_main'] / 1e9:>5.2f} {r['rss_tree'] / 1e9:>5.2f} "
                        f"{r['load'][0]:>4.1f}-{r['load'][1]:<4.1f}")
                if args.floor:
                    line += f" {create_floor(r['ranks'], args.out_dir):>6.2f}"
                print(line, flush=True)
                if args.prototype and suite == "prototype":
                    wall, cpu = run_prototype(args.prototype, args.prototype_python, dp, args.out_dir)
                    print(f"{'':>7} prototype: wall {wall:.2f} s, cpu {cpu:.1f} s: "
                          f"x{wall / r['wall_s']:.1f} STAGE's wall, x{cpu / r['cpu_s']:.1f} its CPU", flush=True)


if __name__ == "__main__":
    main()
