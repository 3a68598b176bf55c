"""The simulator's issue rules, replayed: which nodes of which ranks ever complete.

ASTRA-sim (astra-sim 518bd513: ``workload/Workload.cc``, ``workload/HardwareResource.cc``,
``network_frontend/analytical/*/…NetworkApi.cc``) runs each rank's trace this way:

* after each completion on a rank, it walks the rank's ready nodes (every dependency,
  data or control, complete) in ascending id and issues each one whose resource is
  free;
* a rank has one compute slot (COMP nodes) and ONE communication slot, shared by
  sends and collectives; receives take no slot;
* a send completes on its own once its data has crossed the network, whether or not
  the receiver has posted its receive (eager); a receive completes once its send's
  data has arrived;
* a collective completes once every member of its group has issued its collective of
  the same rank in that group's sequence, all of one type and size; otherwise never;
* a rank prints "finished" as soon as none of its nodes is in flight and none is
  ready, even when some never ran (they wait on a dependency cycle).

A :class:`Program` is one rank's nodes as the replay needs them; a *process* runs a
program, for one rank or for a whole rank class (see :mod:`.quotient`).
:class:`Links` say which collectives meet and which send feeds which receive.
:func:`run` replays every process at once as an event loop in which each node takes
``duration(process, position)`` time units (1 by default: untimed), and each
collective, if a ``collective`` timing is given, completes on each member when that
timing says from the moments its members issued it.

Time advances in instants: at each instant every process first takes all of its
completions of that instant, then issues its ready nodes in ascending id.  The
outcome therefore depends only on the durations, never on the order in which
processes are visited, so a process standing for a rank class behaves exactly as
each of its ranks would.  When each rank's sends and collectives are totally
ordered by its dependencies (:attr:`Program.ordered`, as STAGE writes them), which
nodes complete does not depend on the durations either: the one communication slot
then always goes to the next node of that order, and every other rule only waits for
something to have happened, so the set of completed nodes is the least fixpoint of
those rules (as in a Kahn process network).  The untimed replay then decides
exactly whether the simulator finishes.  Otherwise it decides for its own timing.

The loop costs a few heap operations per node of the processes replayed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, gt
from typing import Callable, Sequence

from ..trace import NodeType, TraceNode

COMP, SEND, RECV, COLL = 0, 1, 2, 3
KINDS = {NodeType.COMP: COMP, NodeType.COMM_SEND: SEND, NodeType.COMM_RECV: RECV,
         NodeType.COMM_COLL: COLL}

#: (process, position) of a node
Slot = tuple[int, int]
#: duration(process, position) -> time units; None: every node takes 1
Duration = Callable[[int, int], float] | None
#: finish(instance, when each member issued it, in ``Links.members`` order) -> when each
#: member completes it; None: each member takes its duration from the last issue
CollectiveFinish = Callable[[int, list[float]], Sequence[float]] | None


@dataclass(frozen=True, slots=True, eq=False)
class Program:
    """One rank's nodes in ascending id; a node is named by its position here."""

    ids: tuple[int, ...]
    names: tuple[str, ...]
    kinds: bytes
    deps: tuple[tuple[int, ...], ...]  # positions each node waits on (distinct)
    users: tuple[tuple[int, ...], ...]  # positions waiting on each node
    # position -> (comm_type, comm_size) of each collective; (tag, size) of sends, recvs
    comm: dict[int, tuple]
    index: dict[int, int]  # node id -> position
    #: sends and collectives are totally ordered by dependencies (the slot's order
    #: does not depend on timing)
    ordered: bool
    key: tuple = field(repr=False)  # the content, for telling equal programs apart
    # the dependency lists of the node list it was built from (None: ids out of order)
    source: tuple[list, list] | None = field(default=None, repr=False)

    def built_from(self, nodes: Sequence[TraceNode]) -> bool:
        """Whether ``nodes`` give this very program, by a few passes in C over them
        (ids, names, types, dependency lists, communication attributes) instead of
        building it."""
        if self.source is None or len(nodes) != len(self.ids) \
                or tuple(map(_ID, nodes)) != self.ids or tuple(map(_NAME, nodes)) != self.names \
                or bytes(map(KINDS.__getitem__, map(_TYPE, nodes))) != self.kinds \
                or list(map(_DATA, nodes)) != self.source[0] \
                or list(map(_CTRL, nodes)) != self.source[1]:
            return False
        return all(_comm(nodes[pos], kind) == self.comm[pos]
                   for pos, kind in zip(compress(range(len(self.kinds)), self.kinds),
                                        filter(None, self.kinds)))


def build_program(nodes: Sequence[TraceNode]) -> Program:
    """The program of a node list whose ids are unique and whose dependencies exist."""
    ids = tuple(map(_ID, nodes))
    order = nodes
    if any(map(gt, ids, ids[1:])):
        order = sorted(nodes, key=_ID)
        ids = tuple(map(_ID, order))
    index = dict(zip(ids, range(len(ids))))
    if ids and ids[0] == 0 and ids[-1] == len(ids) - 1:  # ids are positions
        deps = tuple([(*node.data_deps, *node.ctrl_deps) for node in order])
    else:
        at = index.__getitem__
        deps = tuple([tuple(map(at, (*node.data_deps, *node.ctrl_deps))) for node in order])
    users: list[list[int]] = [[] for _ in ids]
    for pos, mine in enumerate(deps):
        for dep in mine:
            users[dep].append(pos)
    kinds = bytes(map(KINDS.__getitem__, map(_TYPE, order)))
    comm = {pos: _comm(order[pos], kinds[pos])  # every node but COMP (0)
            for pos in compress(range(len(kinds)), kinds)}
    key = (ids, kinds, deps, tuple(comm.items()))
    source = (list(map(_DATA, order)), list(map(_CTRL, order))) if order is nodes else None
    return Program(ids, tuple(map(_NAME, order)), kinds, deps, tuple(map(tuple, users)), comm,
                   index, _slot_ordered(kinds, deps), key, source)


def _comm(node: TraceNode, kind: int) -> tuple:
    """What a comm node must share with its partners: (comm_type, comm_size) of a
    collective, (comm_tag, comm_size) of a send or receive."""
    return (node.attr("comm_type" if kind == COLL else "comm_tag"), node.attr("comm_size"))


_ID, _TYPE, _NAME = attrgetter("id"), attrgetter("type"), attrgetter("name")
_DATA, _CTRL = attrgetter("data_deps"), attrgetter("ctrl_deps")


def _slot_ordered(kinds: bytes, deps: tuple[tuple[int, ...], ...]) -> bool:
    """Whether each send or collective depends, maybe through others, on the one
    before it in a topological order (so all of them form one chain)."""
    slots = [pos for pos, kind in enumerate(kinds) if kind == SEND or kind == COLL]
    if all(a in deps[b] for a, b in zip(slots, slots[1:])):
        return True  # each waits on the one before it itself, as STAGE writes them
    order = _topological(deps)
    if order is None:
        return False  # a dependency cycle: not every node runs anyway
    rank = {pos: k for k, pos in enumerate(order)}
    latest = [-1] * len(deps)  # topological rank of the latest slot node at or above
    previous = -1
    for pos in order:
        above = max((latest[d] for d in deps[pos]), default=-1)
        if kinds[pos] in (SEND, COLL):
            if above != previous:
                return False
            previous = above = rank[pos]
        latest[pos] = above
    return True


def _topological(deps: tuple[tuple[int, ...], ...]) -> list[int] | None:
    """Positions in a topological order (position order when ids ascend along every
    dependency), None when there is a cycle."""
    if all(d < pos for pos, mine in enumerate(deps) for d in mine):
        return list(range(len(deps)))
    waiting = [len(mine) for mine in deps]
    users: list[list[int]] = [[] for _ in deps]
    for pos, mine in enumerate(deps):
        for d in mine:
            users[d].append(pos)
    ready = [pos for pos, n in enumerate(waiting) if n == 0]
    order = []
    while ready:
        pos = ready.pop()
        order.append(pos)
        for user in users[pos]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    return order if len(order) == len(deps) else None


@dataclass(slots=True)
class Links:
    """How processes meet.

    ``rendezvous[p][pos]`` is the index of the collective instance the collective at
    ``pos`` of process ``p`` takes part in; ``members[i]`` the slots of instance
    ``i`` and ``complete[i]`` whether it can ever complete (every rank of the group
    has it, all of one type and size).  ``sender[p][pos]`` is the send slot feeding
    the receive at ``pos`` of ``p`` (None: no send does).
    """

    rendezvous: list[dict[int, int]]
    members: list[tuple[Slot, ...]]
    complete: list[bool]
    sender: list[dict[int, Slot | None]]


@dataclass(slots=True)
class Replay:
    """What happened to every process: per node, issued and completed, and when."""

    programs: Sequence[Program]
    issued: list[bytearray]
    done: list[bytearray]
    comm_slot: list[int]  # position holding each process's communication slot, or -1
    #: when each process printed "finished" (its last completion, nothing left in
    #: flight), None if it never did
    finish: list[float | None]
    #: with ``times=True``: per process, when each node was issued and completed
    #: (-1: never), as the simulator's per-node log has them
    issued_at: list[list[float]] | None = None
    done_at: list[list[float]] | None = None

    def finished(self, process: int) -> bool:
        """Whether the process prints "finished" (maybe with nodes that never ran)."""
        return self.finish[process] is not None

    def complete(self, process: int) -> bool:
        """Whether every node of the process ran."""
        return all(self.done[process])


def run(programs: Sequence[Program], links: Links, duration: Duration = None, times: bool = False,
        collective: CollectiveFinish = None) -> Replay:
    """Replay ``programs`` (one per process) under the simulator's issue rules; with
    ``times``, record when each node was issued and completed; with ``collective``, time
    each collective from when each of its members issued it (the simulator starts a
    member's part on its issue, so early members may finish first)."""
    count = len(programs)
    kinds = [p.kinds for p in programs]
    users = [p.users for p in programs]
    waiting = [[len(mine) for mine in p.deps] for p in programs]
    issued = [bytearray(len(p.ids)) for p in programs]
    done = [bytearray(len(p.ids)) for p in programs]
    in_flight = [0] * count
    ready = [[pos for pos, n in enumerate(w) if n == 0] for w in waiting]  # heaps
    comp_slot = [-1] * count
    comm_slot = [-1] * count
    last = [0.0] * count
    events: list[tuple[float, int, int]] = []  # (time, process, position) completions
    arrived: dict[Slot, float] = {}  # send slot -> time its data arrives
    posted: dict[Slot, list[Slot]] = {}  # send slot -> receives waiting for it
    met = [0] * len(links.members)  # members of each collective instance issued so far
    joined: dict[Slot, float] = {}  # collective slot -> when it was issued (with ``collective``)
    rendezvous, members, complete = links.rendezvous, links.members, links.complete
    sender = links.sender
    push = heapq.heappush
    issued_at = [[-1.0] * len(p.ids) for p in programs] if times else None
    done_at = [[-1.0] * len(p.ids) for p in programs] if times else None

    def issue(p: int, now: float) -> None:
        heap = ready[p]
        if not heap:
            return
        kind_of, held = kinds[p], []
        while heap:
            pos = heapq.heappop(heap)
            kind = kind_of[pos]
            if times:  # a node held for its slot comes back here when it is issued
                issued_at[p][pos] = now
            if kind == RECV:
                issued[p][pos] = 1
                in_flight[p] += 1
                source = sender[p].get(pos)
                if source is None:
                    continue  # never completes
                if source in arrived:
                    push(events, (max(now, arrived[source]), p, pos))
                else:
                    posted.setdefault(source, []).append((p, pos))
                continue
            if kind == COMP:
                if comp_slot[p] >= 0:
                    held.append(pos)
                    continue
                comp_slot[p] = pos
            else:
                if comm_slot[p] >= 0:
                    held.append(pos)
                    continue
                comm_slot[p] = pos
            issued[p][pos] = 1
            in_flight[p] += 1
            if kind == COLL:
                instance = rendezvous[p][pos]
                met[instance] += 1
                if collective is not None:
                    joined[(p, pos)] = now
                if met[instance] == len(members[instance]) and complete[instance]:
                    group = members[instance]
                    if collective is None:
                        ends = [now + (1 if duration is None else duration(q, qpos)) for q, qpos in group]
                    else:
                        ends = collective(instance, [joined.pop(slot) for slot in group])
                    for (q, qpos), end in zip(group, ends):
                        push(events, (end, q, qpos))
                continue
            took = 1 if duration is None else duration(p, pos)
            push(events, (now + took, p, pos))
            if kind == SEND:
                arrived[(p, pos)] = now + took
                for q, qpos in posted.pop((p, pos), ()):
                    push(events, (now + took, q, qpos))
        ready[p] = held  # ascending, so a heap

    for p in range(count):
        issue(p, 0)
    while events:
        now = events[0][0]
        touched = set()
        while events and events[0][0] == now:
            _, p, pos = heapq.heappop(events)
            done[p][pos] = 1
            if times:
                done_at[p][pos] = now
            in_flight[p] -= 1
            last[p] = now
            kind = kinds[p][pos]
            if kind == COMP:
                comp_slot[p] = -1
            elif kind != RECV:
                comm_slot[p] = -1
            count_down, heap = waiting[p], ready[p]
            for user in users[p][pos]:
                count_down[user] -= 1
                if count_down[user] == 0:
                    push(heap, user)
            touched.add(p)
        for p in sorted(touched):
            issue(p, now)
    finish = [last[p] if not in_flight[p] else None for p in range(count)]
    return Replay(programs, issued, done, comm_slot, finish, issued_at, done_at)
