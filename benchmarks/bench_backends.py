"""Single collectives on ASTRA-sim's analytical and htsim backends, and NCCL's measured times.

Which network model to trust for what: every collective STAGE emits (all-reduce,
all-gather, reduce-scatter, all-to-all) and a send/recv, alone on the whole world of
2 to 64 ranks (the h100 preset: one node up to 8, nodes of 8 above), 64 KiB to 1 GiB
(the collective's comm_size as STAGE writes it; a send's message), through

* ``analytical``: ASTRA-sim's congestion-unaware network (``stage_core.netmodel``
  gives the same nanoseconds);
* ``htsim``: the packet-level backend on the fat tree `stage astrasim --backend htsim`
  writes from the preset (across nodes its frontend aborts: the row says so);
* ``measured``: NCCL kernel times measured by microsoft/vidur on DGX H100 and DGX A100
  (``benchmarks/data/vidur_nccl_dgx.csv``; all-reduce and send/recv only, up to
  64 MiB), simulated at the measured size on the matching preset.

Then the 64-rank "flat" case (one switch of 64 GPUs in htsim, one dimension of 64 in
the analytical network) where htsim took 0.22x the analytical time, taken apart.

Run: ``ASTRA_SIM_BIN=... ASTRA_SIM_HTSIM_BIN=... python benchmarks/bench_backends.py
[--full]`` (the default grid: 2, 8, 16, 64 ranks x 64 KiB, 1 MiB, 16 MiB, 256 MiB;
``--full`` adds 4 and 32 ranks and 1 GiB).  Prints one table per part.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from stage_core.api import (CollectiveType, NodeType, PluginHost, ProgramNode, RankProgram, TraceJob,
                            comm_groups_json)
from stage_adapter_astrasim.command import run_astrasim

DATA = Path(__file__).parent / "data" / "vidur_nccl_dgx.csv"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "astra-sim"
KINDS = {"all_reduce": CollectiveType.ALL_REDUCE, "all_gather": CollectiveType.ALL_GATHER,
         "reduce_scatter": CollectiveType.REDUCE_SCATTER, "all_to_all": CollectiveType.ALL_TO_ALL}
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def collective_set(host, out: Path, world: int, kind: str, size: int) -> Path:
    """Every rank runs one ``kind`` of ``size`` bytes on the whole world; for ``send_recv``
    rank 0 sends to rank 1 in one node, to rank 8 above (the same GPU of the next node:
    ASTRA-sim sends a message over the first dimension in which two ranks differ, so 0 to
    15 would cross NVLink) and the others idle."""
    peer = 1 if world <= 8 else 8
    programs = []
    for r in range(world):
        if kind == "send_recv":
            if r == 0:
                node = ProgramNode(0, "send", NodeType.COMM_SEND, comm_size=size, peer="last", tag=7)
            elif r == peer:
                node = ProgramNode(0, "recv", NodeType.COMM_RECV, comm_size=size, peer="first", tag=7)
            else:  # a kernel of 1 us on h100's roofline (one of 0 ns trips the simulator's first tick)
                node = ProgramNode(0, "idle", NodeType.COMP, num_ops=10**9, tensor_size=10**6)
        else:
            node = ProgramNode(0, kind, NodeType.COMM_COLL, comm_type=KINDS[kind], comm_size=size, group="world")
        programs.append(RankProgram((r,), (node,)))
    job = TraceJob(programs=programs, world_size=world, comm_groups={"1": list(range(world))},
                   group_name=lambda r, key: "1", peer_rank=lambda r, key: peer if key == "last" else 0)
    out.mkdir(parents=True)
    host.backend("chakra").write(job, out)
    (out / "comm_groups.json").write_text(comm_groups_json(job.comm_groups))
    (out / "manifest.json").write_text(json.dumps({"world_size": world, "format": "chakra-et-0.0.4"}))
    return out


def simulate(out: Path, backend: str, binary: str, system: str, **files) -> dict:
    """One run: the time the collective takes (ns: the last finish, every rank started at 0
    or, for send_recv, the receiver's finish), or why there is none."""
    text, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    run_astrasim(out, astra_sim=binary, backend=backend, system=system, as_json=True, out=text, err=err,
                 validate=False, breakdown=False, **files)
    results = json.loads(text.getvalue())
    summary = results["summary"]
    return {"ns": summary["max_finish_time_ns"] if summary["outcome"] == "finished" else None,
            "outcome": summary["outcome"], "seconds": time.perf_counter() - start,
            "comm_ns": max((r.get("comm_time_ns") or 0 for r in results["ranks"]), default=0)}


def measured() -> list[dict]:
    with open(DATA) as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def _size(n: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit:
            return f"{n / unit:g} {name}"
    return f"{n} B"


def _time(ns) -> str:
    return "-" if ns is None else f"{ns / 1e3:,.1f}"


def grid(host, tmp: Path, worlds, sizes, analytical: str, htsim: str) -> None:
    print("## Single collectives on the h100 preset (us; htsim/analytical)\n")
    print(f"{'collective':<15}{'ranks':>6}{'size':>10}{'analytical':>14}{'htsim':>14}{'ratio':>8}  htsim run")
    for kind in (*KINDS, "send_recv"):
        for world in worlds:
            for size in sizes:
                out = collective_set(host, tmp / f"{kind}-{world}-{size}", world, kind, size)
                a = simulate(out, "analytical", analytical, "h100")
                h = simulate(out, "htsim", htsim, "h100")
                ratio = f"{h['ns'] / a['ns']:.2f}" if h["ns"] and a["ns"] else "-"
                print(f"{kind:<15}{world:>6}{_size(size):>10}{_time(a['ns']):>14}{_time(h['ns']):>14}{ratio:>8}"
                      f"  {h['outcome']} ({h['seconds']:.1f} s)", flush=True)
                shutil.rmtree(out)


def against_measurements(host, tmp: Path, analytical: str, htsim: str) -> None:
    print("\n## Against NCCL on DGX (vidur's measurements; us; simulated at the measured size)\n")
    print(f"{'gpu':<6}{'collective':<12}{'ranks':>6}{'nodes':>6}{'size':>11}{'measured':>10}{'analytical':>12}"
          f"{'htsim':>10}{'a/m':>7}{'h/m':>7}")
    for row in measured():
        gpu, kind = row["gpu"], row["collective"]
        workers, per_node, size = int(row["num_workers"]), int(row["devices_per_node"]), int(row["size_bytes"])
        nodes = workers // per_node
        if size not in (67584, MiB, 16 * MiB, 64 * MiB):
            continue
        if kind == "send_recv":
            world = 2 if nodes == 1 else 16  # rank 0 to rank 8: across two nodes of 8
        elif nodes == 1:
            world = workers
        elif per_node == 8:
            world = workers
        else:
            continue  # 2 or 4 GPUs on each of 2 nodes: the presets fill nodes of 8
        out = collective_set(host, tmp / f"m-{gpu}-{kind}-{workers}-{per_node}-{size}", world, kind, size)
        a = simulate(out, "analytical", analytical, gpu)
        h = simulate(out, "htsim", htsim, gpu)
        m = float(row["median_ms"]) * 1e6
        print(f"{gpu:<6}{kind:<12}{workers:>6}{nodes:>6}{_size(size):>11}{_time(m):>10}{_time(a['ns']):>12}"
              f"{_time(h['ns']) if h['ns'] else h['outcome']:>10}"
              f"{(a['ns'] / m if a['ns'] else 0):>7.2f}{(h['ns'] / m if h['ns'] else 0):>7.2f}", flush=True)
        shutil.rmtree(out)


def flat(host, tmp: Path, analytical: str, htsim: str) -> None:
    """The README's 0.22x: 64 ranks on one switch (htsim's switch64 example) against one
    analytical dimension of 64 at the same 400 GiB/s and 936.25 ns, for all-reduces whose
    ring messages are from 256 bytes to 4 MiB."""
    print("\n## 64 ranks on one switch, all-reduce (the 0.22x case; us)\n")
    net = tmp / "flat64.yml"
    net.write_text("topology: [ Switch ]\nnpus_count: [ 64 ]\nbandwidth: [ 400.0 ]  # GB/s\nlatency: [ 936.25 ]  # ns\n")
    topo = SHARED / "htsim-examples" / "switch64_3200g_936ns.topo"
    print(f"{'size':>10}{'message':>10}{'analytical':>12}{'htsim':>10}{'ratio':>7}")
    for size in (64 * KiB, MiB, 16 * MiB, 64 * MiB, GiB):
        out = collective_set(host, tmp / f"flat-{size}", 64, "all_reduce", size)
        a = simulate(out, "analytical", analytical, "h100", network=str(net))
        h = simulate(out, "htsim", htsim, "h100", network=str(net), topology=str(topo))
        message = max(size // 4, 64) // 64
        print(f"{_size(size):>10}{_size(message):>10}{_time(a['ns']):>12}{_time(h['ns']):>10}"
              f"{(h['ns'] / a['ns'] if h['ns'] and a['ns'] else 0):>7.2f}", flush=True)
        shutil.rmtree(out)


def early_receive(host, tmp: Path, analytical: str, htsim: str) -> None:
    """Why: rank 0 runs a kernel (~101 us), sends, runs another, sends again (same tag);
    rank 1 only receives both.  Rank 1 cannot finish before the second send leaves rank 0
    (~202 us) on any network.  htsim's frontend tells the receiver a flow carried its size
    plus one 1,500-byte TCP packet (TcpSrc::set_flowsize adds it, the flow-finish callback
    passes it on) and banks the surplus under (tag, source, destination): a message of at
    most 1,500 bytes leaves enough to complete the next receive before its data exists."""
    print("\n## Two sends of one tag, 101 us apart (rank 1's finish, us)\n")
    print(f"{'message':>10}{'analytical':>12}{'htsim':>10}  rank 0 (second send leaves ~202 us)")
    for size in (1000, 1500, 4096, 100_000):
        kernel = lambda i, deps=(): ProgramNode(i, f"k{i}", NodeType.COMP, tuple(deps), num_ops=10**11,
                                                tensor_size=10**6)
        sender = (kernel(0), ProgramNode(1, "s1", NodeType.COMM_SEND, (0,), comm_size=size, peer="p", tag=7),
                  kernel(2, (0,)), ProgramNode(3, "s2", NodeType.COMM_SEND, (2,), (1,), comm_size=size, peer="p",
                                               tag=7))
        receiver = (ProgramNode(0, "r1", NodeType.COMM_RECV, comm_size=size, peer="p", tag=7),
                    ProgramNode(1, "r2", NodeType.COMM_RECV, (0,), comm_size=size, peer="p", tag=7))
        job = TraceJob(programs=[RankProgram((0,), sender), RankProgram((1,), receiver)], world_size=2,
                       comm_groups={"1": [0, 1]}, group_name=lambda r, key: "1", peer_rank=lambda r, key: 1 - r)
        out = tmp / f"early-{size}"
        out.mkdir()
        host.backend("chakra").write(job, out)
        (out / "comm_groups.json").write_text(comm_groups_json(job.comm_groups))
        (out / "manifest.json").write_text(json.dumps({"world_size": 2, "format": "chakra-et-0.0.4"}))
        finish, outcome = {}, {}
        for backend, binary in (("analytical", analytical), ("htsim", htsim)):
            text = io.StringIO()
            run_astrasim(out, astra_sim=binary, backend=backend, as_json=True, out=text, err=io.StringIO(),
                         validate=False, breakdown=False)
            results = json.loads(text.getvalue())
            finish[backend] = {r["rank"]: r["finish_time_ns"] for r in results["ranks"]}
            outcome[backend] = results["summary"]["outcome"]
        got = finish["htsim"]
        print(f"{size:>8} B{_time(finish['analytical'].get(1)):>12}{_time(got.get(1)):>10}  "
              f"{_time(got.get(0)) if 0 in got else outcome['htsim']}", flush=True)
        shutil.rmtree(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="2-64 ranks x 64 KiB-1 GiB (long: htsim at 1 GiB)")
    ap.add_argument("--part", choices=("grid", "measured", "flat", "all"), default="all")
    args = ap.parse_args(argv)
    analytical, htsim = os.environ.get("ASTRA_SIM_BIN"), os.environ.get("ASTRA_SIM_HTSIM_BIN")
    if not (analytical and htsim):
        print("set ASTRA_SIM_BIN and ASTRA_SIM_HTSIM_BIN (../shared/astra-sim/analytical-unaware and htsim)",
              file=sys.stderr)
        return 2
    host = PluginHost()
    worlds = (2, 4, 8, 16, 32, 64) if args.full else (2, 8, 16, 64)
    sizes = (64 * KiB, MiB, 16 * MiB, 256 * MiB) + ((GiB,) if args.full else ())
    tmp = Path(tempfile.mkdtemp(prefix="stage-bench-backends-"))
    try:
        if args.part in ("grid", "all"):
            grid(host, tmp, worlds, sizes, analytical, htsim)
        if args.part in ("measured", "all"):
            against_measurements(host, tmp, analytical, htsim)
        if args.part in ("flat", "all"):
            flat(host, tmp, analytical, htsim)
            early_receive(host, tmp, analytical, htsim)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
