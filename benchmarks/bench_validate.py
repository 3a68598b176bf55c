"""Throughput of the trace validator on a trace set of over a million nodes.

The set: 256 ranks (tp 8 x dp 8 x pp 4, order tp-dp-pp), 4,000 nodes per rank.  Each
rank runs 16 micro-batches; a micro-batch receives its input from the previous
pipeline stage, runs 60 blocks of (compute, compute, tp all-reduce, compute) and sends
to the next stage; the step ends with data-parallel all-reduces.  Compute nodes are
the same objects on every rank (the validator only reads them), so building is quick
and memory stays small; comm nodes are per rank.

Two runs: ids in dependency order (the usual case), and ids reversed so every
dependency points to a higher id, which sends each rank through the full
topological sort.

With ``--chakra`` the same set (ids in dependency order) is also written as Chakra
ET files, one per rank, and read back the way ``stage generate`` checks what it
wrote: once only reading (``iter_ranks`` over every file), once reading and
validating.  Every pipeline stage after the first starts with a receive, so the first
record of its files differs from rank to rank.  ``--order pp-tp-dp`` numbers the
ranks pp first, so that the four rank classes interleave in rank order.

    /work/venv/bin/python benchmarks/bench_validate.py [--forward-only] [--chakra]
        [--order {tp-dp-pp,pp-tp-dp}]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from stage_core.trace import (CollectiveType, NodeType, ProgramNode, RankProgram, TraceJob,
                              TraceNode, TraceSet)
from stage_core.validate import validate

TP, DP, PP = 8, 8, 4
MICRO_BATCHES = 16
BLOCKS = 60
NODES_PER_RANK = 4000


ORDER = "tp-dp-pp"  # or "pp-tp-dp"; set by --order


def coords(rank: int) -> tuple[int, int, int]:
    """(tp, dp, pp) coordinates of ``rank``."""
    if ORDER == "pp-tp-dp":
        return rank // PP % TP, rank // (PP * TP), rank % PP
    return rank % TP, rank // TP % DP, rank // (TP * DP)


def rank_at(tp: int, dp: int, pp: int) -> int:
    if ORDER == "pp-tp-dp":
        return pp + PP * (tp + TP * dp)
    return tp + TP * (dp + DP * pp)


def peer(rank: int, step: int) -> int:
    """The rank ``step`` pipeline stages after ``rank``."""
    tp, dp, pp = coords(rank)
    return rank_at(tp, dp, pp + step)


def comm_groups() -> dict[str, list[int]]:
    """pg_name "1".."32": tp groups, "33".."64": dp groups."""
    world = range(TP * DP * PP)
    tp = sorted({tuple(r for r in world if coords(r)[1:] == coords(s)[1:]) for s in world})
    dp = sorted({tuple(r for r in world if coords(r)[::2] == coords(s)[::2]) for s in world})
    return {str(i + 1): list(g) for i, g in enumerate(tp + dp)}


def group_of(groups: dict[str, list[int]], rank: int, first: int) -> str:
    return next(name for name, members in groups.items()
                if int(name) >= first and rank in members)


def rank_shape(stage: int) -> list[tuple]:
    """The program of a pipeline stage as (kind, extra) steps, in id order."""
    steps = []
    for m in range(MICRO_BATCHES):
        if stage > 0:
            steps.append(("recv", m))
        for _ in range(BLOCKS):
            steps += [("comp", None), ("comp", None), ("tp", None), ("comp", None)]
        if stage < PP - 1:
            steps.append(("send", m))
    while len(steps) < NODES_PER_RANK - 4:
        steps.append(("comp", None))
    steps += [("dp", None)] * 4
    return steps[:NODES_PER_RANK]


def attrs_comp() -> dict:
    return {"is_cpu_op": ("bool_val", False), "num_ops": ("int64_val", 2_000_000),
            "tensor_size": ("int64_val", 65_536)}


def attrs_comm(kind: str, rank: int, extra, tp_pg: str, dp_pg: str) -> tuple[int, dict]:
    base = {"is_cpu_op": ("bool_val", False)}
    if kind in ("tp", "dp"):
        pg = tp_pg if kind == "tp" else dp_pg
        base.update(comm_type=("int64_val", int(CollectiveType.ALL_REDUCE)),
                    comm_size=("int64_val", 1 << 20), pg_name=("string_val", pg))
        return NodeType.COMM_COLL, base
    other = peer(rank, 1 if kind == "send" else -1)
    base.update({"comm_dst" if kind == "send" else "comm_src": ("int64_val", other),
                 "comm_tag": ("int64_val", extra), "comm_size": ("int64_val", 1 << 22)})
    return (NodeType.COMM_SEND if kind == "send" else NodeType.COMM_RECV), base


def build(reverse_ids: bool) -> TraceSet:
    groups = comm_groups()
    world = TP * DP * PP
    shapes = [rank_shape(s) for s in range(PP)]
    shared: dict[tuple[int, int], TraceNode] = {}  # (stage, index) -> compute node
    ranks = []
    for rank in range(world):
        stage = coords(rank)[2]
        tp_pg, dp_pg = group_of(groups, rank, 1), group_of(groups, rank, 33)
        nodes = []
        for i, (kind, extra) in enumerate(shapes[stage]):
            nid = NODES_PER_RANK - 1 - i if reverse_ids else i
            step = -1 if reverse_ids else 1
            deps = [nid - step] if i else []
            ctrl = [nid - 2 * step] if i >= 2 and i % 3 == 0 else []
            if kind == "comp":
                key = (stage, i)
                if key not in shared:
                    shared[key] = TraceNode(nid, f"comp{i}", NodeType.COMP, deps, ctrl,
                                            attrs_comp())
                nodes.append(shared[key])
            else:
                ntype, attrs = attrs_comm(kind, rank, extra, tp_pg, dp_pg)
                nodes.append(TraceNode(nid, f"{kind}{i}", ntype, deps, ctrl, attrs))
        ranks.append((rank, nodes))
    return TraceSet(world, groups, lambda: iter(ranks))


def measure(reverse_ids: bool) -> None:
    t0 = time.perf_counter()
    trace_set = build(reverse_ids)
    built = time.perf_counter() - t0
    total = sum(len(nodes) for _, nodes in trace_set.iter_ranks())
    comm = sum(n.type != NodeType.COMP for _, nodes in trace_set.iter_ranks() for n in nodes)
    assert total >= 1_000_000, total
    t0 = time.perf_counter()
    problems = validate(trace_set)
    took = time.perf_counter() - t0
    assert problems == [], [str(p) for p in problems[:5]]
    label = "ids reversed (full topological sort)" if reverse_ids else "ids in dependency order"
    print(f"{label}: {trace_set.world_size} ranks, {total:,} nodes ({comm:,} comm), "
          f"built in {built:.2f} s")
    print(f"  validate: {took:.2f} s total, {total / took:,.0f} nodes/s")


def program(stage: int) -> RankProgram:
    """Pipeline stage ``stage`` as a rank-class program (ids in dependency order)."""
    nodes = []
    for i, (kind, extra) in enumerate(rank_shape(stage)):
        deps = (i - 1,) if i else ()
        ctrl = (i - 2,) if i >= 2 and i % 3 == 0 else ()
        common = dict(id=i, name=f"{kind}{i}", data_deps=deps, ctrl_deps=ctrl)
        if kind == "comp":
            nodes.append(ProgramNode(type=NodeType.COMP, num_ops=2_000_000,
                                     tensor_size=65_536, **common))
        elif kind in ("tp", "dp"):
            nodes.append(ProgramNode(type=NodeType.COMM_COLL, comm_size=1 << 20,
                                     comm_type=CollectiveType.ALL_REDUCE, group=kind,
                                     **common))
        else:
            nodes.append(ProgramNode(
                type=NodeType.COMM_SEND if kind == "send" else NodeType.COMM_RECV,
                peer="pp+1" if kind == "send" else "pp-1", tag=extra,
                comm_size=1 << 22, **common))
    ranks = tuple(r for r in range(TP * DP * PP) if coords(r)[2] == stage)
    return RankProgram(ranks, tuple(nodes), f"stage{stage}")


def job() -> TraceJob:
    groups = comm_groups()

    def group_name(rank: int, key: str) -> str:
        return group_of(groups, rank, 1 if key == "tp" else 33)

    def peer_rank(rank: int, key: str) -> int:
        return peer(rank, 1 if key == "pp+1" else -1)

    return TraceJob(programs=tuple(program(s) for s in range(PP)), world_size=TP * DP * PP,
                    comm_groups=groups, group_name=group_name, peer_rank=peer_rank,
                    name="bench-validate")


def measure_chakra() -> None:
    """Write the set as Chakra ET files; time reading them back, then checking them."""
    import json

    from stage_adapter_chakra import et, etread

    tmp = Path(tempfile.mkdtemp(prefix="stage-bench-validate-"))
    try:
        the_job = job()
        t0 = time.perf_counter()
        et.write(the_job, tmp)
        (tmp / "comm_groups.json").write_text(json.dumps(dict(the_job.comm_groups)))
        wrote = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in tmp.iterdir())
        t0 = time.perf_counter()
        total = sum(len(nodes) for _, nodes in etread.read(tmp).iter_ranks())
        read = time.perf_counter() - t0
        t0 = time.perf_counter()
        problems = validate(etread.read(tmp))
        checked = time.perf_counter() - t0
        assert problems == [], [str(p) for p in problems[:5]]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"chakra files: {the_job.world_size} ranks, {total:,} nodes, {size / 1e6:.1f} MB, "
          f"written in {wrote:.2f} s")
    print(f"  read: {read:.2f} s, {total / read:,.0f} nodes/s")
    print(f"  read + validate: {checked:.2f} s, {total / checked:,.0f} nodes/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forward-only", action="store_true",
                        help="skip the run with reversed ids")
    parser.add_argument("--chakra", action="store_true",
                        help="also write the set as Chakra ET files and time reading them")
    parser.add_argument("--order", choices=["tp-dp-pp", "pp-tp-dp"], default=ORDER,
                        help="rank numbering, fastest-varying axis first")
    args = parser.parse_args()
    globals()["ORDER"] = args.order
    measure(reverse_ids=False)
    if not args.forward_only:
        measure(reverse_ids=True)
    if args.chakra:
        measure_chakra()


if __name__ == "__main__":
    main()
