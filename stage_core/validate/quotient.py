"""Which processes the replay runs, and how they meet: one per rank class when the
ranks of each class meet the others consistently, else one per rank.

Ranks of one program (a rank class: same nodes up to pg_name, comm_src, comm_dst)
behave alike in the replay if, for every node position, all of them wait on the same
thing: each collective at that position meets the same collective positions of the
same classes, and each receive at that position is fed by the send at one position
of one class (or by none).  Then one process per class stands for all its ranks
(:mod:`.replay` explains why the order of events cannot tell them apart), and the
replay costs the size of the distinct programs, not of the set.  Linking is checked
on every rank; when it is not consistent, the replay runs one process per rank.

Linking costs, per rank, three passes in C over its collectives' pg_names (they must
be its class's first rank's under a one-to-one renaming; otherwise one pass per group
it uses) and one Python step per group it uses and per receive; then one step per
distinct (group, classes, positions) and collective on it.  The replay costs a few
heap operations per node of each process.  On the 1,024-rank GPT-3 set of
benchmarks/bench_validate_set.py (8 classes of about 7,900 nodes): linking 0.25 s,
replay 0.09 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import eq
from typing import TYPE_CHECKING, Mapping, Sequence

from .replay import Links, Program, Slot

if TYPE_CHECKING:
    from .ranks import RankSummary


@dataclass(slots=True)
class World:
    """The processes to replay: a program each, the ranks each stands for, links."""

    programs: list[Program]
    process_of: list[int]  # rank -> process
    ranks_of: list[list[int]]  # process -> its ranks, ascending
    links: Links
    per_class: bool  # one process per rank class (else one per rank)


class _Inconsistent(Exception):
    """Ranks of one class do not meet the others alike."""


def world(summaries: Mapping[int, RankSummary], programs: Sequence[Program],
          groups: Mapping[str, frozenset[int]], per_class: bool = True) -> World:
    """The processes for ``summaries`` (every rank of the world, each with the index of
    its program in ``programs``): one per class if linking allows it."""
    ranks = range(len(summaries))
    if per_class:
        process_of = [summaries[r].program for r in ranks]
        try:
            return _world(summaries, process_of, list(programs), groups, True)
        except _Inconsistent:
            pass
    own = [programs[summaries[r].program] for r in ranks]
    return _world(summaries, list(ranks), own, groups, False)


def _world(summaries: Mapping[int, RankSummary], process_of: list[int],
           programs: list[Program], groups: Mapping[str, frozenset[int]],
           per_class: bool) -> World:
    ranks_of: list[list[int]] = [[] for _ in programs]
    for rank, p in enumerate(process_of):
        ranks_of[p].append(rank)
    used = [i for i, mine in enumerate(ranks_of) if mine]
    if len(used) < len(programs):  # programs no rank runs (forgotten shapes)
        renumber = {old: new for new, old in enumerate(used)}
        programs = [programs[i] for i in used]
        ranks_of = [ranks_of[i] for i in used]
        process_of = [renumber[p] for p in process_of]
    links = Links([{} for _ in programs], [], [], [{} for _ in programs])
    _link_collectives(summaries, process_of, programs, groups, links)
    _link_pairs(summaries, process_of, programs, links)
    return World(programs, process_of, ranks_of, links, per_class)


def _link_collectives(summaries: Mapping[int, RankSummary], process_of: list[int],
                      programs: list[Program], groups: Mapping[str, frozenset[int]],
                      links: Links) -> None:
    """One collective instance per group and sequence number; in per-class mode the
    members are (class, position) slots, and a slot must meet the same slots
    whichever rank of its class holds it."""
    entries: dict[str, set] = {}  # group -> (process, token of the ids of its collectives)
    ids_of: list[tuple[int, ...]] = []  # token -> the ids, in order
    seen: dict[str, set[int]] = {}  # group -> ranks with collectives on it
    templates: dict[int, tuple] = {}  # process -> (a rank's pg_names, {its pg: token})
    columns: dict[tuple[int, int], tuple] = {}  # (process, id(column)) -> (column, {name: token})
    for rank, summary in summaries.items():
        p = process_of[rank]
        tokens = _stamped(columns, p, summary.stamp)
        if tokens is None:
            known = templates.get(p)
            tokens = None if known is None else _renamed(known, summary.pg_names)
            if tokens is None:
                tokens = {}
                for pg, ids in _ids_by_group(summary.ids, summary.pg_names).items():
                    tokens[pg] = len(ids_of)
                    ids_of.append(ids)
                templates.setdefault(p, (summary.pg_names, tokens))
            _remember_column(columns, p, summary.stamp, tokens)
        for pg, token in tokens.items():
            entries.setdefault(pg, set()).add((p, token))
            seen.setdefault(pg, set()).add(rank)
    instances: dict[tuple, int] = {}
    done: set[frozenset] = set()
    rendezvous = links.rendezvous
    for pg, mine in entries.items():
        if groups[pg] - seen[pg]:  # members without a collective on pg
            ids_of.append(())
            mine.update((process_of[rank], len(ids_of) - 1) for rank in groups[pg] - seen[pg])
        pattern = frozenset(mine)
        if pattern in done:
            continue
        done.add(pattern)
        sequences = [(p, ids_of[token]) for p, token in pattern]
        for k in range(max(len(ids) for _, ids in sequences)):
            slots = tuple(sorted({(p, programs[p].index[ids[k]])
                                  for p, ids in sequences if len(ids) > k}))
            complete = (all(len(ids) > k for _, ids in sequences)
                        and len({programs[p].comm[pos] for p, pos in slots}) == 1)
            key = (slots, complete)
            instance = instances.get(key)
            if instance is None:
                instance = instances[key] = len(links.members)
                links.members.append(slots)
                links.complete.append(complete)
            for p, pos in slots:
                if rendezvous[p].setdefault(pos, instance) != instance:
                    raise _Inconsistent


def _stamped(columns: dict, p: int, stamp: tuple | None) -> dict | None:
    """This rank's pg_name -> token from its stamp alone (see RankSummary.stamp), when
    another rank of its process had the same column: no pass over its collectives."""
    if stamp is None:
        return None
    column, renamed = stamp
    known = columns.get((p, id(column)))
    if known is None or known[0] is not column:
        return None
    tokens = {renamed.get(name, name): token for name, token in known[1].items()}
    return tokens if len(tokens) == len(known[1]) else None  # (one-to-one)


def _remember_column(columns: dict, p: int, stamp: tuple | None, tokens: dict) -> None:
    """Record the tokens of a stamped rank's groups by the column's own names."""
    if stamp is None or (p, id(stamp[0])) in columns:
        return
    column, renamed = stamp
    by_name = {name: tokens.get(renamed.get(name, name)) for name in dict.fromkeys(column)}
    if None not in by_name.values() and len(set(by_name.values())) == len(by_name):
        columns[(p, id(column))] = (column, by_name)


def _renamed(template: tuple, pg_names: Sequence[str]) -> dict | None:
    """This rank's pg_name -> token, when its pg_names are the template rank's under a
    one-to-one renaming (the usual case within a class: three passes in C); else None."""
    names, tokens = template
    rename = dict(zip(names, pg_names))
    if len(rename) != len(tokens) or len(set(rename.values())) != len(rename) \
            or list(map(rename.__getitem__, names)) != list(pg_names):
        return None
    return {rename[pg]: token for pg, token in tokens.items()}


def _ids_by_group(ids: Sequence[int], pg_names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """pg_name -> the ids of its collectives, in order."""
    distinct = dict.fromkeys(pg_names)
    if len(distinct) == 1:
        return {pg: tuple(ids) for pg in distinct}
    if len(distinct) <= 8:  # the usual few groups: a pass in C for each
        return {pg: tuple(compress(ids, map(eq, pg_names, repeat(pg)))) for pg in distinct}
    out: dict[str, list[int]] = {}
    for nid, pg in zip(ids, pg_names):
        out.setdefault(pg, []).append(nid)
    return {pg: tuple(mine) for pg, mine in out.items()}


_UNSET = object()


def _link_pairs(summaries: Mapping[int, RankSummary], process_of: list[int],
                programs: list[Program], links: Links) -> None:
    """The k-th receive of (src, tag, size) on a rank is fed by the k-th send of
    (that rank, tag, size) on src, both in node order; extra receives by nothing."""
    sender = links.sender
    for rank, summary in summaries.items():
        p = process_of[rank]
        index, mine = programs[p].index, sender[p]
        for (src, tag, size), recvs in summary.recvs.items():
            sends = summaries[src].sends.get((rank, tag, size), ())
            q = process_of[src]
            theirs = programs[q].index
            for k, (nid, _) in zip(count(), recvs):
                source: Slot | None = (q, theirs[sends[k][0]]) if k < len(sends) else None
                known = mine.get(index[nid], _UNSET)
                if known is _UNSET:
                    mine[index[nid]] = source
                elif known != source:
                    raise _Inconsistent
