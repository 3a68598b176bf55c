"""Write a TraceJob as one file per rank, through a format's encoding."""

from __future__ import annotations

from pathlib import Path

from stage_core.trace import TraceJob

from .errors import ChakraWriteError
from .stamp import compile_program, stamp_rank

PREFIX = "trace"


def check_ranks(job: TraceJob) -> None:
    """Every rank 0..world_size-1 must be in exactly one program."""
    seen: dict[int, int] = {}
    for i, program in enumerate(job.programs):
        for rank in program.ranks:
            if not 0 <= rank < job.world_size:
                raise ChakraWriteError(
                    f"program {i} lists rank {rank}, outside 0..{job.world_size - 1}")
            if rank in seen:
                raise ChakraWriteError(f"rank {rank} is in programs {seen[rank]} and {i}")
            seen[rank] = i
    if len(seen) != job.world_size:
        missing = sorted(set(range(job.world_size)) - set(seen))
        raise ChakraWriteError(
            f"no program for {len(missing)} rank(s), first {missing[:8]}")


def write_job(job: TraceJob, out_dir: Path, enc, suffix: str) -> list[Path]:
    """Write ``<out_dir>/trace.<rank>.<suffix>`` for every rank; return the paths."""
    check_ranks(job)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for program in job.programs:
        stamp = compile_program(program, enc)
        for rank in program.ranks:
            path = out_dir / f"{PREFIX}.{rank}.{suffix}"
            enc.write_file(path, stamp_rank(stamp, rank, job, enc))
            written.append(path)
    return written
