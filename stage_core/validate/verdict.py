"""Whether ASTRA-sim finishes a set: the replay's verdict, and in one line why the
first rank that never finishes is stuck."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from ..rankset import ranks_text
from .firsttick import FirstTick
from .problems import Problem, coll_text, shortened
from .quotient import World, world
from .replay import COLL, RECV, Program, Replay, run

if TYPE_CHECKING:
    from .ranks import RankSummary


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the replay predicts the simulator does with a set."""

    unfinished: tuple[int, ...]  # ranks that never print "finished"
    #: every rank's sends and collectives are ordered by its dependencies, so the
    #: verdict holds whatever the simulator's timing
    timing_independent: bool
    processes: int  # processes replayed (rank classes, or ranks)
    per_class: bool  # one process per rank class
    blocked: Problem | None  # the first rank that never finishes, and why
    #: ranks whose first kernel takes 0 ns on some GPUs' rooflines: the simulator aborts
    #: at its first tick there (see :mod:`.firsttick`), whatever the order
    first_tick: FirstTick | None = None

    @property
    def finishes(self) -> bool:
        return not self.unfinished and self.first_tick is None


def decide(summaries: Mapping[int, RankSummary], programs: Sequence[Program],
           groups: Mapping[str, frozenset[int]], per_class: bool = True) -> Verdict:
    """Replay every rank of ``summaries`` (the whole world, each rank runnable)."""
    the_world = world(summaries, programs, groups, per_class)
    replay = run(the_world.programs, the_world.links)
    unfinished = tuple(sorted(rank for p, ranks in enumerate(the_world.ranks_of)
                              if not replay.finished(p) for rank in ranks))
    unordered = [rank for p, ranks in enumerate(the_world.ranks_of)
                 if not the_world.programs[p].ordered for rank in ranks]
    blocked = None
    if unfinished:
        why = _Why(the_world, replay, summaries, groups)
        blocked = why.first(unfinished, sorted(unordered))
    return Verdict(unfinished, not unordered, len(the_world.programs),
                   the_world.per_class, blocked)


class _Why:
    """The wait chain from a stuck node of a rank, rank by rank, until it comes back
    on itself or ends at a node that can never complete."""

    def __init__(self, the_world: World, replay: Replay,
                 summaries: Mapping[int, RankSummary], groups: Mapping[str, frozenset[int]]):
        self.world, self.replay = the_world, replay
        self.summaries, self.groups = summaries, groups

    def first(self, unfinished: Sequence[int], unordered: Sequence[int]) -> Problem:
        rank = unfinished[0]
        p = self.world.process_of[rank]
        issued, done = self.replay.issued[p], self.replay.done[p]
        waiting = [pos for pos in range(len(done)) if issued[pos] and not done[pos]]
        pos = waiting[0] if waiting else done.index(0)
        program = self.world.programs[p]
        others = [r for r in unfinished if r != rank]
        text = "never finishes in ASTRA-sim"
        if others:
            text += f" (nor does rank {others[0]})" if len(others) == 1 else \
                f" (nor do {_ranks(others)})"
        text += ": it " + _joined(shortened(self._chain(rank, pos)))
        if unordered:
            text += (f" (as replayed with every node taking equal time: the sends and "
                     f"collectives of {_ranks(unordered)} are not ordered by their "
                     f"dependencies, so the simulator's timing decides their order)")
        return Problem(rank, program.ids[pos], program.names[pos], text)

    def _chain(self, rank: int, pos: int) -> list[str]:
        """What each node waits on, from ``pos`` of ``rank`` on: each step names the
        node the next one is about."""
        steps: list[str] = []
        seen: set[tuple[int, int]] = set()
        while True:
            seen.add((rank, pos))
            said, target = self._step(rank, pos)
            if target in seen:
                said += " above"
                target = None
            steps.append(said)
            if target is None:
                return steps
            rank, pos = target

    def _node(self, rank: int, pos: int) -> str:
        p = self.world.process_of[rank]
        program = self.world.programs[p]
        nid = program.ids[pos]
        if program.kinds[pos] != COLL:
            return f"{nid} ({program.names[pos]})"
        pg, k, _ = self._coll(rank, nid)
        return f"{nid} ({program.names[pos]}, collective #{k} on group {pg!r})"

    def _coll(self, rank: int, nid: int) -> tuple[str, int, tuple[int, int]]:
        """Group, number on it and (type, size) of the collective ``nid`` of ``rank``."""
        summary = self.summaries[rank]
        at = bisect_left(summary.ids, nid)
        pg = summary.pg_names[at]
        return pg, summary.pg_names[:at].count(pg), (summary.comm_types[at],
                                                     summary.comm_sizes[at])

    def _step(self, rank: int, pos: int) -> tuple[str, tuple[int, int] | None]:
        """Why node ``pos`` of ``rank`` does not complete, and the node it waits on."""
        p = self.world.process_of[rank]
        program = self.world.programs[p]
        issued, done = self.replay.issued[p], self.replay.done[p]
        kind = program.kinds[pos]
        if issued[pos]:
            if kind == RECV:
                return self._receive(rank, program.ids[pos])
            if kind == COLL:
                return self._collective(rank, program.ids[pos])
        if all(done[d] for d in program.deps[pos]):
            holder = self.replay.comm_slot[p]
            if holder < 0:  # (cannot happen: only a collective holds a slot forever)
                return "is never issued", None
            return (f"waits for the communication slot, held by node "
                    f"{self._node(rank, holder)}", (rank, holder))
        blocker = self._blocker(program, issued, done, pos)
        if blocker is None:
            return "waits on a dependency cycle", None
        return f"waits on node {self._node(rank, blocker)}", (rank, blocker)

    @staticmethod
    def _blocker(program: Program, issued: bytearray, done: bytearray, pos: int) -> int | None:
        """The first node under ``pos`` (through unfinished dependencies, lowest first)
        that was issued or is ready; None when the walk comes back (a cycle)."""
        seen = {pos}
        while True:
            pos = next(d for d in program.deps[pos] if not done[d])
            if issued[pos] or all(done[d] for d in program.deps[pos]):
                return pos
            if pos in seen:
                return None
            seen.add(pos)

    def _receive(self, rank: int, nid: int) -> tuple[str, tuple[int, int] | None]:
        summary = self.summaries[rank]
        for (src, tag, size), recvs in summary.recvs.items():
            k = next((k for k, (rid, _) in enumerate(recvs) if rid == nid), None)
            if k is None:
                continue
            sends = self.summaries[src].sends.get((rank, tag, size), ())
            if k >= len(sends):
                return (f"waits on a send from rank {src} (tag {tag}, {size} bytes) "
                        f"that rank {src} does not have", None)
            target = (src, self._position(src, sends[k][0]))
            return f"waits on rank {src}'s send, node {self._node(*target)}", target
        raise AssertionError(f"rank {rank} has no receive {nid}")

    def _collective(self, rank: int, nid: int) -> tuple[str, tuple[int, int] | None]:
        pg, k, mine = self._coll(rank, nid)
        for member in sorted(self.groups[pg]):
            theirs = self.summaries[member]
            on_group = [i for i, name in enumerate(theirs.pg_names) if name == pg]
            if k >= len(on_group):
                return (f"waits on rank {member}, which issues only {len(on_group)} "
                        f"collectives on group {pg!r}", None)
            i = on_group[k]
            if (theirs.comm_types[i], theirs.comm_sizes[i]) != mine:
                return (f"never completes: it is {coll_text(mine)} here but "
                        f"{coll_text((theirs.comm_types[i], theirs.comm_sizes[i]))} on "
                        f"rank {member}", None)
            target = (member, self._position(member, theirs.ids[i]))
            if not self.replay.issued[self.world.process_of[member]][target[1]]:
                name = self.world.programs[self.world.process_of[member]].names[target[1]]
                return (f"waits on rank {member} to issue its collective #{k} on group "
                        f"{pg!r}, node {theirs.ids[i]} ({name}), which rank {member} never "
                        f"reaches", target)
        return "never completes", None

    def _position(self, rank: int, nid: int) -> int:
        return self.world.programs[self.world.process_of[rank]].index[nid]


def _joined(steps: Sequence[str]) -> str:
    """Steps as one sentence: each continues from the node the one before names."""
    text = steps[0]
    for before, step in zip(steps, steps[1:]):
        if step.startswith("..."):
            text += f", {step}"
        elif before.endswith("never reaches"):
            text += f": it {step}"
        else:
            text += f", which {step}"
    return text


def _ranks(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ",".join(shortened(ranks_text(ranks).split(",")))
