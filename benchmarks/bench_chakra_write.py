"""Throughput of the Chakra trace writer (stage-adapter-chakra).

Builds a synthetic job (default: 1,024 ranks sharing one program of 5,000 nodes,
5% of them collectives on two group keys, "tp" and "dp"), writes it with the
``chakra`` backend (or ``chakra-json``) into a temporary directory, and prints
nodes per second and MB per second written.

    python benchmarks/bench_chakra_write.py [--ranks 1024] [--nodes 5000]
        [--coll-frac 0.05] [--format chakra|chakra-json] [--repeat 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from stage_core.trace import CollectiveType, NodeType, ProgramNode, RankProgram, TraceJob

from stage_adapter_chakra import et, jsontrace

TP = 8
COLL_TYPES = (CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER,
              CollectiveType.REDUCE_SCATTER, CollectiveType.ALL_TO_ALL)


def build_program(ranks: int, nodes: int, coll_frac: float) -> RankProgram:
    """A chain of compute nodes with a collective every 1/coll_frac nodes."""
    every = max(1, round(1 / coll_frac)) if coll_frac > 0 else 0
    out = []
    for i in range(nodes):
        deps = (i - 1,) if i else ()
        if every and i % every == every - 1:
            out.append(ProgramNode(
                id=i, name=f"coll_{i}", type=NodeType.COMM_COLL, data_deps=deps,
                comm_type=COLL_TYPES[i % len(COLL_TYPES)], comm_size=(1 + i % 64) << 20,
                group="tp" if i % 2 else "dp"))
        else:
            out.append(ProgramNode(
                id=i, name=f"layer{i // 12}_op{i % 12}", type=NodeType.COMP, data_deps=deps,
                num_ops=2 * 4096 * 4096 * (1 + i % 16) * 1024, tensor_size=(1 + i % 32) << 22))
    return RankProgram(ranks=tuple(range(ranks)), nodes=tuple(out), label="all")


def build_job(ranks: int, nodes: int, coll_frac: float) -> TraceJob:
    dp = ranks // TP

    def group_name(rank: int, key: str) -> str:
        if key == "tp":
            return str(1 + rank // TP)
        return str(1 + dp + rank % TP)

    groups = {str(1 + g): list(range(g * TP, (g + 1) * TP)) for g in range(dp)}
    groups.update({str(1 + dp + t): list(range(t, ranks, TP)) for t in range(TP)})
    return TraceJob(programs=(build_program(ranks, nodes, coll_frac),), world_size=ranks,
                    comm_groups=groups, group_name=group_name,
                    peer_rank=lambda rank, key: rank, name="bench")


def run(job: TraceJob, fmt: str, out: Path) -> tuple[float, int]:
    writer = et.write if fmt == "chakra" else jsontrace.write
    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    writer(job, out)
    elapsed = time.perf_counter() - start
    size = sum(p.stat().st_size for p in out.iterdir())
    return elapsed, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--coll-frac", type=float, default=0.05)
    ap.add_argument("--format", choices=("chakra", "chakra-json"), default="chakra")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="keep the traces here")
    args = ap.parse_args()

    job = build_job(args.ranks, args.nodes, args.coll_frac)
    total_nodes = args.ranks * args.nodes
    colls = sum(n.type == NodeType.COMM_COLL for n in job.programs[0].nodes)
    print(f"{args.format}: {args.ranks} ranks x {args.nodes} nodes "
          f"({colls} collectives on 2 group keys) = {total_nodes:,} nodes")
    tmp = Path(tempfile.mkdtemp(prefix="bench_chakra_"))
    out = args.out or tmp / "traces"
    try:
        best = None
        for i in range(args.repeat):
            elapsed, size = run(job, args.format, out)
            best = elapsed if best is None else min(best, elapsed)
            print(f"  run {i + 1}: {elapsed:.3f} s, {size / 1e6:.1f} MB, "
                  f"{total_nodes / elapsed:,.0f} nodes/s, {size / 1e6 / elapsed:,.1f} MB/s")
        print(f"best: {total_nodes / best:,.0f} nodes/s, {size / 1e6 / best:,.1f} MB/s "
              f"({size / args.ranks / 1e3:.1f} kB per rank)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
