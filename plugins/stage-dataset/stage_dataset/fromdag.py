"""``stage from-dag FILE --graph N -o DIR``: a DAG as a Chakra trace set ASTRA-sim runs.

Every rank runs the DAG (one rank class); what it needs of the others comes from its
collectives and messages:

* **ranks and groups**: one mesh axis per distinct group size of the collectives (in
  the order they first appear), and one of 2 ranks for the messages when there are
  any; the world is their product (``--ranks`` a multiple of it: replicas).  A
  collective runs on its rank's group along the axis of its size.
* **messages**: the ranks of the message axis form a ring.  A send goes to the next
  rank, a receive comes from the previous one; what the other side does is added to
  every rank: for each receive, a send of its size to the next rank, at the start of
  the program (it waits for nothing, so the receive it feeds never waits on this
  rank's own progress), and for each send, a receive from the previous rank that
  nothing waits for.
* **order**: the nodes in dependency order (the lowest number first among the
  ready), each rank's sends and collectives chained one after the other in that order,
  as STAGE's lowering chains them, so every member of a group issues its collectives in
  one order whatever the timing (docs/design.md, "The one communication slot").

Sizes come from the graph's features, or the category's defaults (:mod:`.dag`); a
kernel without FLOPs is written with ``num_ops`` 1, sizes of 0 as 1 byte (ASTRA-sim
stalls on a zero).  The set is written and validated as every set is
(:func:`stage_core.api.write_trace_set`: read back, replayed under the simulator's
rules, renamed into place).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from stage_core import __version__
from stage_core.api import (COMM_KEYS, NodeType, PluginHost, ProgramNode, RankProgram, TraceJob, UsageError, hardware,
                            kernel, write_trace_set)

from . import dag as dag_mod
from .graphs import FEATURES

HELP = "a DAG (a graph of a stage dataset, LayerDAG's .pth, or a JSON DAG) as a Chakra trace set for ASTRA-sim"
#: the largest world from-dag builds
MAX_RANKS = 4096
_COLL_TYPE = {name: ctype for ctype, name in COMM_KEYS.items()}
_F = {f: j for j, f in enumerate(FEATURES)}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a dataset split (.npz), LayerDAG's .pth, or a JSON DAG (.json)")
    p.add_argument("--graph", type=int, default=0, metavar="N", help="which graph of the file (default 0)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the trace set's folder")
    p.add_argument("--categories", metavar="FILE",
                   help="the categories' names and defaults (default: categories.json beside FILE)")
    p.add_argument("--defaults", action="store_true",
                   help="size every node by its category's defaults, ignoring the graph's features")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="the world: a multiple of the ranks the groups and messages need (default: exactly those)")
    p.add_argument("--gpu", metavar="NAME",
                   help="time every kernel on this hardware preset (default: untimed, the simulator's roofline)")
    p.add_argument("--format", default="chakra", help="trace format (default chakra)")


def run(args: argparse.Namespace) -> int:
    host = getattr(args, "stage_host", None) or PluginHost()
    categories = Path(args.categories) if args.categories else None
    dag = dag_mod.read(Path(args.file), args.graph, categories, features=not args.defaults)
    hw = hardware.resolve(host, args.gpu) if args.gpu else None
    built = build(dag, args.ranks, host, hw)
    host.backend(args.format)
    write_trace_set(host, built, Path(args.output), args.format)
    world = built.job.world_size
    print(f"wrote {args.output}: graph {args.graph} of {args.file}, {len(dag)} nodes as {len(built.job.programs[0].nodes)} "
          f"per rank on {world} ranks (groups of {', '.join(map(str, built.axes)) or 'none'}), validated")
    return 0


@dataclass
class Built:
    """What :func:`stage_core.api.write_trace_set` writes: the job and its manifest."""

    job: TraceJob
    manifest: dict[str, Any]
    axes: tuple[int, ...] = ()
    extras: dict[str, int] = field(default_factory=dict)


class RingMesh:
    """Ranks on axes (fastest first); groups along each axis; a ring along the message axis."""

    def __init__(self, sizes: tuple[int, ...], ring: int | None):
        self.sizes = sizes
        self.world = prod(sizes) if sizes else 1
        self.strides = [prod(sizes[:i]) for i in range(len(sizes))]
        self.ring = ring
        self.groups: dict[str, list[int]] = {}
        self._name: dict[tuple[int, int], str] = {}
        for axis in range(len(sizes)):
            for rank in range(self.world):
                if self._coord(rank, axis) == 0:
                    members = [rank + k * self.strides[axis] for k in range(sizes[axis])]
                    name = str(len(self.groups) + 1)
                    self.groups[name] = members
                    for m in members:
                        self._name[(axis, m)] = name

    def _coord(self, rank: int, axis: int) -> int:
        return rank // self.strides[axis] % self.sizes[axis]

    def group_name(self, rank: int, key: str) -> str:
        return self._name[(int(key.removeprefix("axis")), rank)]

    def peer_rank(self, rank: int, key: str) -> int:
        step = 1 if key == "next" else -1
        c = self._coord(rank, self.ring)
        return rank + ((c + step) % self.sizes[self.ring] - c) * self.strides[self.ring]


def build(dag: dag_mod.Dag, ranks: int | None, host: PluginHost, hw=None) -> Built:
    """The DAG as one program every rank runs (see the module docstring)."""
    n = len(dag)
    feats = dag.features
    where = f"{dag.source['file']} graph {dag.source['graph']}"
    sizes: list[int] = []
    for i in range(n):
        if dag.kinds[i] == "collective":
            g = int(feats[i, _F["group_size"]])
            if g < 2:
                raise UsageError(f"{where}, node {i}: a {dag.categories[i]} over {g} rank(s); a collective needs 2 "
                                 f"or more (group_size)")
            if dag.categories[i] not in _COLL_TYPE:
                raise UsageError(f"{where}, node {i}: collective {dag.categories[i]!r} is not one ASTRA-sim "
                                 f"simulates ({', '.join(_COLL_TYPE)})")
            if g not in sizes:
                sizes.append(g)
    messages = any(k in ("send", "recv") for k in dag.kinds)
    axes = tuple(sizes) + ((2,) if messages else ())
    base = prod(axes) if axes else 1
    world = ranks or base
    if ranks is not None and (ranks < 1 or ranks % base):
        raise UsageError(f"--ranks {ranks}: must be a multiple of {base}, the ranks the graph's groups "
                         f"({', '.join(map(str, axes)) or 'none'}) need")
    if world > MAX_RANKS:
        raise UsageError(f"{where}: its groups need {world} ranks, more than {MAX_RANKS}; give a graph with "
                         f"smaller groups")
    all_axes = axes + ((world // base,) if world > base else ())
    mesh = RingMesh(all_axes, len(sizes) if messages else None)

    timer = None
    if hw is not None:
        model = host.compute_model(hw.gpu.compute_model, hw.gpu.name)
        timer = lambda k: model.time(k, hw.gpu)  # noqa: E731

    order = dag.order()
    deps: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for src, dst, kind in dag.edges:
        deps[dst].append((src, kind))
    nodes: list[ProgramNode] = []
    recvs = [i for i in order if dag.kinds[i] == "recv"]
    sends = [i for i in order if dag.kinds[i] == "send"]
    tag_of = {i: 1 + k for k, i in enumerate(recvs)}
    tag_of.update({i: 1 + len(recvs) + k for k, i in enumerate(sends)})
    chain: int | None = None  # the last send or collective: the next one waits for it

    def size(i: int, feature: str) -> int:
        return max(1, int(feats[i, _F[feature]]))

    for i in recvs:  # what the previous rank sends to each receive, first
        nodes.append(ProgramNode(len(nodes), f"feed.{i}:send", NodeType.COMM_SEND,
                                 ctrl_deps=() if chain is None else (chain,), comm_size=size(i, "message_bytes"),
                                 peer="next", tag=tag_of[i]))
        chain = len(nodes) - 1
    position: dict[int, int] = {}
    micros_exact = 0.0
    micros_written = 0
    for i in order:
        data = tuple(dict.fromkeys(position[s] for s, kind in deps[i] if kind == 0))
        ctrl = tuple(p for p in dict.fromkeys(position[s] for s, kind in deps[i] if kind == 1) if p not in data)
        name = f"dag.{i}:{dag.categories[i]}"
        kind = dag.kinds[i]
        if kind == "compute":
            flops, nbytes = size(i, "flops"), size(i, "bytes")
            k = _kernel(dag.categories[i], flops, nbytes)
            micros = 0
            if timer is not None:
                micros_exact += timer(k) * 1e6
                micros = round(micros_exact) - micros_written
                micros_written += micros
            nodes.append(ProgramNode(len(nodes), name, NodeType.COMP, data, ctrl, num_ops=flops, tensor_size=nbytes,
                                     flops_kind="matmul" if k.matmul_flops else "other", kernel=k,
                                     duration_micros=micros))
        elif kind == "recv":  # a receive takes no slot: it waits for its own dependencies only
            nodes.append(ProgramNode(len(nodes), name, NodeType.COMM_RECV, data, ctrl,
                                     comm_size=size(i, "message_bytes"), peer="prev", tag=tag_of[i]))
        else:
            if chain is not None and chain not in data and chain not in ctrl:
                ctrl = ctrl + (chain,)
            if kind == "collective":
                g = int(feats[i, _F["group_size"]])
                nodes.append(ProgramNode(len(nodes), name, NodeType.COMM_COLL, data, ctrl,
                                         comm_type=_COLL_TYPE[dag.categories[i]], comm_size=size(i, "message_bytes"),
                                         group=f"axis{sizes.index(g)}"))
                chain = len(nodes) - 1
            else:
                nodes.append(ProgramNode(len(nodes), name, NodeType.COMM_SEND, data, ctrl,
                                         comm_size=size(i, "message_bytes"), peer="next", tag=tag_of[i]))
                chain = len(nodes) - 1
        position[i] = len(nodes) - 1
    for i in sends:  # what the next rank receives of each send; nothing waits for it
        nodes.append(ProgramNode(len(nodes), f"drain.{i}:recv", NodeType.COMM_RECV,
                                 comm_size=size(i, "message_bytes"), peer="prev", tag=tag_of[i]))

    program = RankProgram(tuple(range(world)), tuple(nodes), label="dag")
    job = TraceJob(programs=[program], world_size=world, comm_groups=mesh.groups, group_name=mesh.group_name,
                   peer_rank=mesh.peer_rank, name="dag")
    manifest = _manifest(dag, program, world, all_axes, hw, micros_written if timer is not None else None)
    job.manifest = manifest
    return Built(job, manifest, axes, {"feeds": len(recvs), "drains": len(sends)})


def _kernel(category: str, flops: int, nbytes: int):
    """What a compute model sees of a node of ``category`` (``kind[:fn]/phase``)."""
    head, _, phase = category.partition("/")
    kind, _, fn = head.partition(":")
    matmul = flops if kind == "einsum" or fn.startswith("flash_attention") else 0
    return kernel(kind, fn, phase or "forward", "", {}, "bf16", flops=flops, matmul_flops=matmul, nbytes=nbytes)


def _manifest(dag, program: RankProgram, world: int, axes, hw, micros) -> dict[str, Any]:
    comp = [n for n in program.nodes if n.type == NodeType.COMP]
    matmul = sum(n.num_ops for n in comp if n.flops_kind == "matmul")
    total = sum(n.num_ops for n in comp)
    comm = {key: 0 for key in (*COMM_KEYS.values(), "send", "recv")}
    for n in program.nodes:
        if n.type == NodeType.COMM_COLL:
            comm[COMM_KEYS[n.comm_type]] += n.comm_size
        elif n.type == NodeType.COMM_SEND:
            comm["send"] += n.comm_size
        elif n.type == NodeType.COMM_RECV:
            comm["recv"] += n.comm_size
    rc = {"ranks": list(range(world)), "flops": {"matmul": matmul, "other": total - matmul, "total": total},
          "comm_bytes": comm, "kernel_bytes": sum(n.tensor_size for n in comp), "nodes": len(program.nodes)}
    out = {"stage_version": __version__, "format": "chakra-et-0.0.4", "units": {"compute": "FLOPs", "sizes": "bytes"},
           "source": {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in dag.source.items()},
           "dag": {"nodes": len(dag), "edges": len(dag.edges), "axes": list(axes)},
           "world_size": world, "rank_classes": [rc]}
    if hw is not None:
        out["hardware"] = hardware.to_dict(hw)
        out["compute_model"] = hw.gpu.compute_model
        rc["compute_time_us"] = micros
    return out
