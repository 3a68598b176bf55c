"""Writing a large set right after a big delete, on the filesystem of --dir (ext4 here).

Creates a set of N ranks (``stage generate``, gpt-tiny data parallel, untimed, not
validated: the writing alone), then deletes COPIES copies of it and writes it again at
once, then again after a pause; and the same with bare file creation (os.open of N
empty-ish files), to tell STAGE's part from the filesystem's.  Prints seconds per phase.

    python benchmarks/bench_write_after_delete.py [--ranks 4096] [--copies 6] [--dir /tmp]

What probes of bare creation showed on this machine's ext4 (2026-12-03, 4,096 files of
3,000 B, 6 copies of a 4,096-rank set deleted): on a quiet machine, 1.2-1.6 s in a folder
beside the deleted files for at least 60 s after the delete, 0.09-0.12 s in a folder
elsewhere on the filesystem at the same moments; under load both were slow (4.3-4.4 s).
The cost follows where inodes were freed, not the time since.  A profile of ``stage
generate`` in such a folder: 5.3 of its 6.2 s in the 4,096 ``os.open`` calls.  Run it on a
quiet machine, with --dir on the filesystem to measure; its figures vary with what that
filesystem saw before (docs/design.md, "What comes next").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def generate(out: Path, ranks: int) -> float:
    exe = shutil.which("stage") or str(Path(sys.executable).parent / "stage")
    start = time.perf_counter()
    done = subprocess.run([exe, "generate", "--model", "gpt-tiny", "--dp", str(ranks), "--gpu", "none", "-o",
                           str(out), "--quiet", "--no-validate"], capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr.strip())
    return time.perf_counter() - start


def create(folder: Path, n: int) -> float:
    folder.mkdir()
    start = time.perf_counter()
    for i in range(n):
        fd = os.open(folder / f"trace.{i}.et", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"\0" * 3000)
        os.close(fd)
    return time.perf_counter() - start


def big_delete(root: Path, source: Path, copies: int, pause: float) -> float:
    for k in range(copies):
        shutil.copytree(source, root / f"copy{k}")
    os.sync()
    time.sleep(pause)  # (the copies' own creation window passes)
    start = time.perf_counter()
    for k in range(copies):
        shutil.rmtree(root / f"copy{k}")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--copies", type=int, default=6, help="copies of the set deleted before the timed write")
    ap.add_argument("--pause", type=float, default=10.0, help="seconds waited before the 'later' runs")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="a folder on the filesystem to measure")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stage-bench-", dir=args.dir))
    try:
        n = args.ranks
        time.sleep(args.pause)
        rows = [("stage generate, before", generate(root / "a", n)),
                ("bare creation, before", create(root / "f0", n))]
        deleted = big_delete(root, root / "a", args.copies, args.pause)
        rows.append((f"(deleting {args.copies} copies: {args.copies * (n + 2):,} files)", deleted))
        rows.append(("stage generate, right after the delete", generate(root / "b", n)))
        deleted = big_delete(root, root / "a", args.copies, args.pause)
        rows.append(("bare creation, right after another delete", create(root / "f1", n)))
        time.sleep(args.pause)
        rows.append((f"stage generate, {args.pause:g} s later", generate(root / "c", n)))
        rows.append((f"bare creation, {args.pause:g} s later", create(root / "f2", n)))
        print(f"{n:,} ranks on {args.dir}")
        for label, seconds in rows:
            print(f"  {label:48} {seconds:7.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
