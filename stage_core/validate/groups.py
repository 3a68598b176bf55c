"""Collectives: group definitions, membership, each group's sequence on its members,
and a deadlock-free order across groups."""

from __future__ import annotations

from collections import Counter
from itertools import compress, repeat
from operator import eq
from typing import TYPE_CHECKING, Mapping, Sequence

from ..trace import TraceNode, TraceSet
from .graphs import find_cycle, kahn_leftover, rotated
from .problems import Problems, Recorder, coll_text, instance_text, names_text, shortened

if TYPE_CHECKING:
    from .ranks import RankSummary


def check_groups(trace_set: TraceSet, out: Problems) -> dict[str, frozenset[int]]:
    """Members of each group, after checking names and ranks of comm_groups."""
    groups = {}
    for name, members in trace_set.comm_groups.items():
        if not (isinstance(name, str) and name.isdecimal() and int(name) > 0):
            out.at(None, None, "", f"comm group name {name!r} is not a decimal string > 0")
        bad = [m for m in members if not 0 <= m < trace_set.world_size]
        if bad:
            out.at(None, None, "", f"comm group {name!r} names ranks {bad} outside "
                   f"0..{trace_set.world_size - 1}")
        members_set = frozenset(members)
        if len(members_set) != len(members):
            out.at(None, None, "", f"comm group {name!r} lists a rank twice: {list(members)}")
        groups[str(name)] = members_set
    return groups


def check_ring_order(comm_groups: Mapping[str, Sequence[int]], out: Problems) -> None:
    """Every group lists its members in the plan's ring order.  A collective runs as a ring
    over a group's members in comm_groups.json order, so the order is part of its cost
    (reordered, a step of the same set takes other time in the simulator); a plan's mesh
    lists every group's ranks ascending (:meth:`stage_core.parallel.mesh.Mesh.all_group_members`),
    the tied embedding's first and last stage and a served set's offset groups too."""
    for name, members in comm_groups.items():
        members = list(members)
        if any(a >= b for a, b in zip(members, members[1:])) and len(set(members)) == len(members):
            ring = sorted(members)
            out.at(None, None, "", f"comm group {name!r} lists its members as {shortened_list(members)}, not in the "
                                   f"plan's ring order {shortened_list(ring)} (ascending, as the plan's mesh lays "
                                   f"them out): the ring's order is part of every collective's cost on it")


def shortened_list(values: Sequence[int], shown: int = 8) -> str:
    values = list(values)
    return str(values) if len(values) <= shown else f"[{', '.join(map(str, values[:shown]))}, ... {len(values)} ranks]"


def check_group(rank: int, node: TraceNode, numbers: tuple | None,
                groups: Mapping[str, frozenset[int]], collectives: list,
                out: Recorder) -> None:
    """The rank part of a collective: its pg_name names a group the rank is in."""
    pg_name = node.attr("pg_name")
    if not isinstance(pg_name, str):
        return
    members = groups.get(pg_name)
    if members is None:
        out.add(rank, node, f"pg_name {pg_name!r} is not in comm_groups "
                f"({names_text(groups)})")
    elif rank not in members:
        out.add(rank, node, f"rank {rank} is not a member of group {pg_name!r} "
                f"{sorted(members)}")
    elif numbers is not None:
        collectives.append((node.id, pg_name, *numbers, node.name))


def check_collectives(groups: Mapping[str, frozenset[int]],
                      summaries: Mapping[int, RankSummary], out: Problems) -> None:
    """Collective sequences per group, then a deadlock-free order across groups.

    A first pass finds out whether anything is wrong, at the cost of a few passes in
    C over each rank's collectives: each member's (type, size) sequence on a group
    is numbered (equal sequences, equal numbers), and the order graph is proved
    acyclic through a small quotient of it (see below).  Only a group whose members'
    numbers differ, or an order graph that may have a cycle, is then examined in
    full by :func:`check_sequences` / :func:`check_collective_order`, which name
    the defects exactly as a full examination of every group would.
    """
    numbered: dict[tuple, int] = {((), ()): 0}  # (types, sizes) -> its number
    per_group: dict[str, dict[int, int]] = {}  # pg_name -> rank -> sequence number
    chains: dict[tuple, int] = {}  # a rank's collective ids -> its chain number
    # pg_name -> (chain, positions of its collectives) of its member with the most
    labels: dict[str, tuple[int, list[int]]] = {}
    slots = _Slots()
    # ranks given as a shared column with groups renamed (RankSummary.stamp): their
    # chain, and per group of the column its positions and sequence number, once
    shared: dict[int, tuple] = {}  # id(column) -> (column, ids, types, sizes, chain, [(pg, where, number)])
    for rank, summary in summaries.items():
        got = _shared(shared, summary, chains, numbered)
        if got is None:
            chain = chains.setdefault(tuple(summary.ids), len(chains))
            by_group = _numbered(summary.pg_names, summary, numbered)
        else:
            chain, by_group = got
        for pg, where, number in by_group:
            per_group.setdefault(pg, {})[rank] = number
            known = labels.setdefault(pg, (chain, where))
            if known[0] != chain or (known[1] is not where and known[1] != where):
                slots.join(known, (chain, where))
                if len(where) > len(known[1]):
                    labels[pg] = (chain, where)
    for pg, by_rank in per_group.items():
        members = [m for m in sorted(groups[pg]) if m in summaries]
        if len({by_rank.get(m, 0) for m in members}) > 1:
            check_sequences(pg, members, summaries, out)
    # The order graph G has a vertex (pg_name, k) for the k-th collective on a group
    # and an edge from each collective of a rank to its next one.  Ranks with the
    # same collective ids share a chain of slots (chain, 0), (chain, 1), ... with an
    # edge from each slot to the next; the k-th collective on a group sits, on each
    # member, in the slot of its position, and the slots of all members of (pg, k)
    # are joined into one vertex of a quotient graph Q.  Mapping each vertex of G to
    # its joined slots maps every edge of G to an edge of Q, so a cycle of G would
    # give one of Q: when Q has none, G has none.  Usually no slots are joined (the
    # members of every group run one program) and Q is a set of paths; otherwise Q
    # is about as small as the programs, and Kahn's algorithm decides.  If Q may have
    # a cycle, G is examined in full, and a cycle named by check_collective_order.
    if not slots.joined:
        return
    edges: set[tuple] = set()
    for ids, chain in chains.items():
        vertices = [slots.find((chain, pos)) for pos in range(len(ids))]
        edges.update(zip(vertices, vertices[1:]))
    if not kahn_leftover(edges)[0]:
        return
    number: dict[str, int] = {}  # pg_name -> number of its collective #0
    edges = set()
    for summary in summaries.values():
        seen: Counter = Counter()
        vertices = []
        for pg in summary.pg_names:
            vertices.append(number.setdefault(pg, len(number) << 32) + seen[pg])
            seen[pg] += 1
        edges.update(zip(vertices, vertices[1:]))
    if kahn_leftover(edges)[0]:
        check_collective_order(issue_order(summaries), out)


class _Slots:
    """Union-find over the slots (chain, position) of :func:`check_collectives`."""

    def __init__(self) -> None:
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        self.joined: set[tuple] = set()  # the (chain, positions) pairs joined so far

    def join(self, a: tuple[int, list[int]], b: tuple[int, list[int]]) -> None:
        """Join the slots of the k-th positions of ``a`` and ``b``, for each k."""
        key = (a[0], tuple(a[1]), b[0], tuple(b[1]))
        if key in self.joined:
            return
        self.joined.add(key)
        for pos_a, pos_b in zip(a[1], b[1]):
            root_a, root_b = self.find((a[0], pos_a)), self.find((b[0], pos_b))
            if root_a != root_b:
                self.parent[root_a] = root_b

    def find(self, slot: tuple[int, int]) -> tuple[int, int]:
        parent = self.parent
        while True:
            up = parent.get(slot)
            if up is None:
                return slot
            top = parent.get(up)
            if top is None:
                return up
            parent[slot] = slot = top  # path halving


def _shared(shared: dict, summary: RankSummary, chains: dict, numbered: dict) -> tuple | None:
    """(chain, [(pg_name, positions, sequence number)]) of a rank whose pg_names are a
    shared column under a one-to-one renaming (see check_collectives); None otherwise."""
    if summary.stamp is None:
        return None
    column, renamed = summary.stamp
    got = shared.get(id(column))
    if got is None or got[0] is not column or got[1] is not summary.ids or got[2] is not summary.comm_types \
            or got[3] is not summary.comm_sizes:
        if len(summary.ids) != len(column):
            return None
        got = shared[id(column)] = (column, summary.ids, summary.comm_types, summary.comm_sizes,
                                    chains.setdefault(tuple(summary.ids), len(chains)),
                                    _numbered(column, summary, numbered))
    by_group = got[5]
    if renamed:
        by_group = [(renamed.get(pg, pg), where, number) for pg, where, number in by_group]
        if len({pg for pg, _, _ in by_group}) != len(by_group):
            return None  # (two groups became one)
    return got[4], by_group


def _numbered(pg_names: Sequence[str], summary: RankSummary, numbered: dict) -> list[tuple[str, list[int], int]]:
    """(pg_name, its positions, the number of its (types, sizes) sequence) per group."""
    out = []
    for pg, where in _positions_by_group(pg_names).items():
        seq = (tuple(map(summary.comm_types.__getitem__, where)), tuple(map(summary.comm_sizes.__getitem__, where)))
        out.append((pg, where, numbered.setdefault(seq, len(numbered))))
    return out


def _positions_by_group(pg_names: Sequence[str]) -> dict[str, list[int]]:
    """pg_name -> the positions where it occurs, for each distinct one in order."""
    distinct = dict.fromkeys(pg_names)
    if len(distinct) <= 8:  # the usual few groups: a pass in C for each
        every = range(len(pg_names))
        return {pg: list(compress(every, map(eq, pg_names, repeat(pg)))) for pg in distinct}
    where: dict[str, list[int]] = {}
    for pos, pg in enumerate(pg_names):
        where.setdefault(pg, []).append(pos)
    return where


def check_sequences(pg: str, members: Sequence[int], summaries: Mapping[int, RankSummary],
                    out: Problems) -> None:
    """Compare the members' (type, size) sequences on ``pg`` with the majority's."""
    by_rank = {m: [(ctype, size, nid, name)
                   for nid, p, ctype, size, name in summaries[m].collectives() if p == pg]
               for m in members}
    _compare_members(pg, members, by_rank, out)


def issue_order(summaries: Mapping[int, RankSummary]
                ) -> dict[int, list[tuple[str, int, int, str]]]:
    """Each rank's collectives as (pg_name, position in group, id, name), in id order."""
    ordered: dict[int, list[tuple[str, int, int, str]]] = {}
    for rank, summary in summaries.items():
        seen: Counter = Counter()
        mine = ordered[rank] = []
        for nid, pg, _, _, name in summary.collectives():
            mine.append((pg, seen[pg], nid, name))
            seen[pg] += 1
    return ordered


def _compare_members(pg: str, members: Sequence[int], by_rank: Mapping[int, list],
                     out: Problems) -> None:
    keys = {m: tuple((t, s) for t, s, _, _ in by_rank.get(m, ())) for m in members}
    reference_key = Counter(keys[m] for m in members).most_common(1)[0][0]
    ref = next(m for m in members if keys[m] == reference_key)
    ref_seq = by_rank.get(ref, [])
    for member in members:
        if keys[member] != reference_key:
            _report_difference(pg, member, by_rank.get(member, []), ref, ref_seq, out)


def _report_difference(pg: str, rank: int, seq: list, ref: int, ref_seq: list,
                       out: Problems) -> None:
    for k, (mine, theirs) in enumerate(zip(seq, ref_seq)):
        if mine[:2] != theirs[:2]:
            out.at(rank, mine[2], mine[3], f"collective #{k} on group {pg!r} is "
                   f"{coll_text(mine)} here but {coll_text(theirs)} on rank {ref} "
                   f"(node {theirs[2]})")
            return
    k = min(len(seq), len(ref_seq))
    if len(seq) > len(ref_seq):
        extra = seq[k]
        out.at(rank, extra[2], extra[3], f"rank issues {len(seq)} collectives on group "
               f"{pg!r} but rank {ref} issues {len(ref_seq)}; collective #{k} "
               f"({coll_text(extra)}) has no partner")
    else:
        missing = ref_seq[k]
        out.at(rank, None, "", f"rank issues {len(seq)} collectives on group {pg!r} but "
               f"rank {ref} issues {len(ref_seq)}; missing collective #{k} "
               f"({coll_text(missing)}, node {missing[2]} on rank {ref})")


def check_collective_order(ordered: Mapping[int, list[tuple[str, int, int, str]]],
                           out: Problems) -> None:
    """Collective instances ordered by each rank's issue order must form a DAG.

    A vertex is (pg_name, k), the k-th collective on that group; each rank adds an
    edge from each of its collectives to its next one (in node id order).  A cycle
    means every rank on it waits for a collective that another rank on it has not
    issued yet: a deadlock.
    """
    witness: dict[tuple, tuple[int, int, str, int, str]] = {}
    for rank, colls in ordered.items():
        for (pg_a, k_a, id_a, name_a), (pg_b, k_b, id_b, name_b) in zip(colls, colls[1:]):
            witness.setdefault(((pg_a, k_a), (pg_b, k_b)), (rank, id_a, name_a, id_b, name_b))
    stuck, preds = kahn_leftover(witness)
    if not stuck:
        return
    # reversed, each vertex is issued before the next one on some rank
    cycle = rotated(find_cycle(stuck, lambda v: preds[v])[::-1])
    steps = []
    for u, v in zip(cycle, cycle[1:] + cycle[:1]):
        rank, id_u, _, id_v, _ = witness[(u, v)]
        steps.append(f"rank {rank} issues node {id_u} ({instance_text(u)}) before node "
                     f"{id_v} ({instance_text(v)})")
    rank, id_u, name_u, _, _ = witness[(cycle[0], cycle[1 % len(cycle)])]
    out.at(rank, id_u, name_u, "collectives deadlock, their order differs between "
           "ranks: " + "; ".join(shortened(steps)))
