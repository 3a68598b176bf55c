"""`stage report` against the number of micro-batches: the whole command in a fresh process
(wall and CPU seconds, peak RSS) and its planning step alone.

    python benchmarks/bench_report.py

Issue 9 asked for `report --micro-batches 100000` in under 2 s and 200 MB (it took 75 s
and 5 GB when every micro-batch was lowered).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

CASES = [
    ("gpt-tiny", ["--dp", "8"]),
    ("gpt3-175b", ["--tp", "8", "--pp", "8", "--schedule", "interleaved", "--virtual-stages", "2"]),
]
COUNTS = (8, 1_000, 100_000)


def run_cli(model: str, flags: list[str], m: int) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS KB) of `stage report` in a new process."""
    code = ("import sys; from stage_core.cli import main; "
            f"sys.exit(main(['report', '--model', {model!r}, *{flags!r}, '--micro-batches', '{m}']))")
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)  # this process's own CPU time and peak RSS
    wall = time.perf_counter() - start
    assert os.waitstatus_to_exitcode(status) == 0
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def main() -> None:
    from stage_core.api import plan_job
    from stage_core.cli import build_parser, plan_from_args
    from stage_core.plugins import PluginHost

    host = PluginHost()
    print(f"{'model':<10} {'micro-batches':>13} {'plan_job s':>10} {'CLI wall s':>10} {'CLI cpu s':>9} "
          f"{'peak RSS MB':>11}")
    for model, flags in CASES:
        for m in COUNTS:
            args = build_parser(host).parse_args(["report", "--model", model, *flags, "--micro-batches", str(m)])
            name, overrides, plan, _ = plan_from_args(args, host)
            start = time.perf_counter()
            plan_job(host, name, overrides, plan, programs=False)
            inner = time.perf_counter() - start
            wall, cpu, rss = run_cli(model, flags, m)
            print(f"{model:<10} {m:>13,} {inner:>10.2f} {wall:>10.2f} {cpu:>9.2f} {rss / 1024:>11.0f}")


if __name__ == "__main__":
    main()
