"""Write a TraceJob as one file per rank, through a format's encoding.

Each class program is compiled once (:mod:`.stamp`).  The ranks to write are cut
into batches of consecutive ranks of one class; a batch resolves its slot values
with the job's array functions, encodes each distinct value once, and writes its
files one at a time, so memory holds one file, whatever the number of ranks.

Batches run in ``job.workers`` processes (None: one per core), forked so that they
share the compiled classes.  A file is a function of its class and rank alone, so
the bytes written are the same with any number of workers.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from stage_core.api import TraceJob, die_with_parent

from .attrs import resolve
from .errors import ChakraWriteError
from .stamp import Stamp, compile_program

PREFIX = "trace"
#: ranks per batch at most (a batch is one task of a worker)
BATCH = 128
#: fewer files than this per worker are written in this process (forking costs more)
MIN_FILES_PER_WORKER = 256


def check_ranks(job: TraceJob) -> list[np.ndarray]:
    """Every rank 0..world_size-1 must be in exactly one program.  Returns each
    program's ranks to write (those of ``job.ranks``, or all), ascending."""
    world = job.world_size
    ranks = [np.asarray(p.ranks, dtype=np.int64) for p in job.programs]
    every = np.concatenate(ranks) if ranks else np.zeros(0, dtype=np.int64)
    program = np.repeat(np.arange(len(ranks)), [len(r) for r in ranks])
    outside = (every < 0) | (every >= world)
    if outside.any():
        k = outside.argmax()
        raise ChakraWriteError(f"program {program[k]} lists rank {every[k]}, outside 0..{world - 1}")
    counts = np.bincount(every, minlength=world)
    twice = np.flatnonzero(counts > 1)
    if len(twice):
        first, second = program[every == twice[0]][:2]
        raise ChakraWriteError(f"rank {twice[0]} is in programs {first} and {second}")
    missing = np.flatnonzero(counts == 0)
    if len(missing):
        raise ChakraWriteError(
            f"no program for {len(missing)} rank(s), first {missing[:8].tolist()}")
    if job.ranks is None:
        return [np.sort(r) for r in ranks]
    subset = np.asarray(list(job.ranks), dtype=np.int64)
    outside = (subset < 0) | (subset >= world)
    if outside.any():
        raise ChakraWriteError(f"rank {subset[outside.argmax()]} asked for is outside 0..{world - 1}")
    wanted = np.zeros(world, dtype=bool)
    wanted[subset] = True
    return [np.sort(r[wanted[r]]) for r in ranks]


# the state a batch reads; set before the workers are forked, so they inherit it
_JOB: tuple | None = None


def _batches(per_class: Sequence[np.ndarray]) -> list[tuple[int, list[int]]]:
    """(class index, ranks) batches in the order of their first rank."""
    out = []
    for i, ranks in enumerate(per_class):
        for start in range(0, len(ranks), BATCH):
            out.append((i, ranks[start:start + BATCH].tolist()))
    out.sort(key=lambda b: b[1][0])
    return out


def _write_batch(batch: tuple[int, list[int]]) -> int:
    index, ranks = batch
    job, stamps, out_dir, enc, suffix = _JOB
    stamp: Stamp = stamps[index]
    columns: dict[tuple[str, str], list] = {}
    per_slot = []
    for slot in stamp.slots:
        source = (slot.source, slot.key)
        if source not in columns:
            try:
                columns[source] = resolve(job, slot.source, slot.key, ranks)
            except ValueError as exc:
                raise ChakraWriteError(f"{slot.source} {slot.key!r}: {exc}") from None
        per_slot.append((slot, columns[source], {}))
    for j, rank in enumerate(ranks):
        values = []
        for slot, column, encoded in per_slot:
            value = column[j]
            piece = encoded.get(value)
            if piece is None:
                try:
                    piece = encoded[value] = enc.slot(slot, value)
                except (TypeError, ValueError) as exc:
                    raise ChakraWriteError(
                        f"rank {rank}: {slot.name} from {slot.source} {slot.key!r} "
                        f"= {value!r}: {exc}") from None
            values.append(piece)
        _write_file(out_dir / f"{PREFIX}.{rank}.{suffix}", stamp.file(tuple(values)))
    return len(ranks)


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _worker_signals() -> None:
    # the parent decides on an interrupt and ends the workers; a handler it installed
    # (cleaning up the output folder, say) must not run in them; a killed parent takes
    # them with it (no worker goes on writing into a folder nobody will move into place)
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


def _run(batches: list, workers: int) -> Iterator[int]:
    if workers <= 1:
        yield from map(_write_batch, batches)
        return
    with multiprocessing.get_context("fork").Pool(workers, initializer=_worker_signals) as pool:
        yield from pool.imap_unordered(_write_batch, batches)


def write_job(job: TraceJob, out_dir: Path, enc, suffix: str) -> int:
    """Write ``<out_dir>/trace.<rank>.<suffix>`` for the job's ranks; return how many."""
    global _JOB
    per_class = check_ranks(job)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamps = [compile_program(p, enc) if len(r) else None for p, r in zip(job.programs, per_class)]
    batches = _batches(per_class)
    files = sum(map(len, per_class))
    workers = job.workers or default_workers()
    if "fork" not in multiprocessing.get_all_start_methods():
        workers = 1
    workers = max(1, min(workers, files // MIN_FILES_PER_WORKER, len(batches)))
    _JOB = (job, stamps, out_dir, enc, suffix)
    try:
        for done in _run(batches, workers):
            if job.progress is not None:
                job.progress(done)
    finally:
        _JOB = None
    return files
