"""A step time without a simulator: the rank-class programs replayed under the simulator's
rules, each node timed as ASTRA-sim would time it.

The programs are the ones ``stage generate --gpu`` writes (compute nodes timed by the
GPU's compute model, background communication placed in the one communication
slot); nothing is written to disk.  One process per rank class replays them
(:mod:`stage_core.validate.replay`: one compute slot, one communication slot shared by
sends and collectives, ready nodes issued in ascending id, receives unlimited), with

* a compute node taking its ``duration_micros`` x 1000 ns (0 taken as 1 ns, as
  ``Workload::issue_replay`` does);
* a send taking its message's time on the network (:mod:`stage_core.netmodel`), its receive
  completing when the data has arrived;
* a collective completing on each member when its ring does, each member starting
  when it issued it (:meth:`stage_core.netmodel.Network.collective_finish_ns`; when all issue
  at once, :meth:`stage_core.netmodel.Network.collective_ns` after that).

A process stands for a rank class: a collective across classes is timed for the
class's first rank, each member rank starting when its class issued it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from stage_core.records import HardwareSpec
from stage_core.api import COMM_KEYS, NodeType, ProgramNode, TraceJob, netmodel, replay


_KIND = {NodeType.COMP: replay.COMP, NodeType.COMM_SEND: replay.SEND, NodeType.COMM_RECV: replay.RECV,
         NodeType.COMM_COLL: replay.COLL}


@dataclass(frozen=True)
class ClassTime:
    """One rank class's step, in ns: its finish and what it is made of (they add up)."""

    ranks: int
    finish_ns: float
    compute_ns: float
    exposed_comm_ns: float
    bubble_ns: float


@dataclass(frozen=True)
class Estimate:
    step_ns: float
    classes: tuple[ClassTime, ...]
    #: per rank class, when each node of its program was issued and when it was done (ns), in program order
    issued_ns: tuple[tuple[float, ...], ...] = ()
    done_ns: tuple[tuple[float, ...], ...] = ()

    @property
    def step_time_s(self) -> float:
        return self.step_ns * 1e-9


def program_of(nodes: Sequence[ProgramNode]) -> replay.Program:
    """The replay's view of a lowered program (ids are positions, dependencies point back)."""
    ids = tuple(range(len(nodes)))
    kinds = bytes(_KIND[n.type] for n in nodes)
    deps = tuple(tuple(dict.fromkeys((*n.data_deps, *n.ctrl_deps))) for n in nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for pos, mine in enumerate(deps):
        for d in mine:
            users[d].append(pos)
    comm = {}
    for pos, n in enumerate(nodes):
        if n.type == NodeType.COMM_COLL:
            comm[pos] = (int(n.comm_type), n.comm_size)
        elif n.type != NodeType.COMP:
            comm[pos] = (n.tag, n.comm_size)
    return replay.Program(ids, tuple(n.name for n in nodes), kinds, deps, tuple(map(tuple, users)), comm,
                          {i: i for i in ids}, True, (len(nodes),))


class _World:
    """The processes (one per rank class), how they meet, and every node's time."""

    def __init__(self, job: TraceJob, net: netmodel.Network):
        self.job, self.net = job, net
        programs = job.programs
        self.first = [p.ranks[0] for p in programs]
        class_of = np.empty(job.world_size, dtype=np.int64)
        for i, p in enumerate(programs):
            class_of[list(p.ranks)] = i
        self.class_of = class_of
        self.programs = [program_of(p.nodes) for p in programs]
        self.links = replay.Links([{} for _ in programs], [], [], [{} for _ in programs])
        self.durations: list[list[float]] = []
        self._members: dict[tuple[int, str | None], tuple[int, ...]] = {}
        self._classes: dict[tuple[int, str | None], frozenset] = {}
        instances: dict[tuple, int] = {}
        sends: dict[tuple, list[int]] = {}
        recvs: list[tuple[int, int, tuple]] = []
        for p, prog in enumerate(programs):
            rank = self.first[p]
            seen: dict[str | None, int] = {}
            times = []
            for pos, node in enumerate(prog.nodes):
                if node.type == NodeType.COMP:
                    times.append(node.duration_micros * 1000 if node.duration_micros else 1)
                elif node.type == NodeType.COMM_COLL:
                    members = self.members(p, node.group)
                    classes = self._classes.get((p, node.group))
                    if classes is None:
                        classes = self._classes[(p, node.group)] = frozenset(
                            np.unique(class_of[np.asarray(members)]).tolist())
                    k = seen.get(node.group, 0)
                    seen[node.group] = k + 1
                    # a group inside the class meets only itself; one across classes, the
                    # k-th collective on the same key of every member class
                    key = (p, pos) if classes == {p} else (classes, node.group, k)
                    instance = instances.get(key)
                    if instance is None:
                        instance = instances[key] = len(self.links.members)
                        self.links.members.append(())
                        self.links.complete.append(True)
                    self.links.members[instance] += ((p, pos),)
                    self.links.rendezvous[p][pos] = instance
                    times.append(net.collective_ns(COMM_KEYS[node.comm_type], node.comm_size, members))
                elif node.type == NodeType.COMM_SEND:
                    peer = job.peer_rank(rank, node.peer)
                    sends.setdefault((p, int(class_of[peer]), node.tag, node.comm_size), []).append(pos)
                    times.append(net.message_ns(rank, peer, node.comm_size))
                else:
                    source = int(class_of[job.peer_rank(rank, node.peer)])
                    recvs.append((p, pos, (source, p, node.tag, node.comm_size)))
                    times.append(0)
            self.durations.append(times)
        used: dict[tuple, int] = {}
        for p, pos, key in recvs:
            k = used.get(key, 0)
            used[key] = k + 1
            mine = sends.get(key, ())
            self.links.sender[p][pos] = (key[0], mine[k]) if k < len(mine) else None

    def collective_finish(self, instance: int, issued: list[float]) -> list[float]:
        """When each member slot of ``instance`` completes, given when each issued it."""
        slots = self.links.members[instance]
        if min(issued) == max(issued):
            return [issued[0] + self.durations[q][qpos] for q, qpos in slots]
        at = dict(zip((q for q, _ in slots), issued))  # one slot per class
        ends = []
        for q, qpos in slots:
            node = self.job.programs[q].nodes[qpos]
            ring = self.members(q, node.group)
            starts = [at[c] for c in self.class_of[list(ring)].tolist()]
            finish = self.net.collective_finish_ns(COMM_KEYS[node.comm_type], node.comm_size, ring, starts)
            ends.append(finish[ring.index(self.first[q])])
        return ends

    def members(self, p: int, group: str | None) -> tuple[int, ...]:
        got = self._members.get((p, group))
        if got is None:
            if group is None:
                got = tuple(range(self.job.world_size))
            else:
                got = tuple(self.job.comm_groups[self.job.group_name(self.first[p], group)])
            self._members[(p, group)] = got
        return got


def estimate_job(job: TraceJob, hw: HardwareSpec) -> Estimate:
    """The step of ``job`` (timed programs, one per rank class) on ``hw``'s network."""
    world = _World(job, netmodel.Network.of(hw, job.world_size))
    durations = world.durations
    done = replay.run(world.programs, world.links, lambda p, pos: durations[p][pos], times=True,
                      collective=world.collective_finish)
    stuck = [i for i, f in enumerate(done.finish) if f is None or not done.complete(i)]
    if stuck:
        raise ValueError(f"rank classes {stuck} never finish in the replay: the programs deadlock")
    classes = []
    for p, prog in enumerate(world.programs):
        start, end = done.issued_at[p], done.done_at[p]
        compute = [(start[i], end[i]) for i, k in enumerate(prog.kinds) if k == replay.COMP]
        slot = [(start[i], end[i]) for i, k in enumerate(prog.kinds) if k in (replay.SEND, replay.COLL)]
        finish = done.finish[p]
        classes.append(ClassTime(len(job.programs[p].ranks), finish, *netmodel.step_breakdown(compute, slot, finish)))
    return Estimate(max(c.finish_ns for c in classes), tuple(classes), tuple(map(tuple, done.issued_at)),
                    tuple(map(tuple, done.done_at)))

