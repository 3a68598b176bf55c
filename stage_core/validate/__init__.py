"""Check a decoded trace set against what ASTRA-sim needs (REFERENCE.md §6).

ASTRA-sim is silent about many defects: a dependency cycle, a duplicate id, a send
without a receive or collectives that differ between the members of a group leave
ranks unfinished while the simulator still exits 0.  :func:`validate` finds them.

It walks ``trace_set.iter_ranks()`` once.  Each rank's nodes are checked on their
own and reduced to a summary of its comm nodes; only those summaries are kept for the
checks across ranks.  Everything is linear in the number of nodes, with iterative
graph walks only.  The checks, by concern:

* :mod:`.structure` - one rank's ids, dependencies, cycles, node types, attributes
  (against the tables of :mod:`.contract`); :mod:`.shapes` reuses that result for
  every rank of one shape (ranks of a rank class differ only in pg_name, comm_src
  and comm_dst), and :mod:`.ranks` adds each rank's own part and its summary;
* :mod:`.groups` - comm group definitions, membership, each group's collective
  sequence on its members, a deadlock-free order across groups;
* :mod:`.pairs` - peers, and every send meeting its receive;
* :mod:`.manifest` - a STAGE set's manifest.json (``trace_set.metadata["manifest"]``)
  against the files: world size, rank classes, and each class's nodes, FLOPs, kernel
  bytes, bytes per collective type and compute time recomputed from every rank.
* :mod:`.replay` - the simulator's issue rules (one compute slot, one communication
  slot shared by sends and collectives, receives unlimited, ascending id), replayed
  on every rank at once: whether every rank finishes.  :mod:`.quotient` runs one
  process per rank class when the classes meet consistently, :mod:`.verdict` names
  the first rank that never finishes and why.  :mod:`.firsttick` adds the one abort
  that order does not decide: a first kernel of 0 ns on a GPU's roofline.

A set without a manifest has no plan and no costs to check its files against; the
report says so (``Report.manifest``), and ``stage validate --require-manifest``
refuses it.  With one, every group's members must run in the plan's ring order
(ascending ranks, as the mesh lists them): the order is part of a collective's cost.

A set may hold some ranks of its world only (``trace_set.ranks``, written with
``stage generate --ranks``): each rank present is checked in full, a group's
sequences among its members present, and a send or receive only when its peer is
present too; the replay needs the whole world.

The replay needs a set the simulator can run: every rank present, every node
well-formed, every group and peer right.  Dependency cycles, collective sequences
that differ and sends or receives without a partner it replays (they are what
leaves ranks unfinished).  Its deadlock is reported only when nothing else was
found; :func:`examine` gives its verdict in any case.

:mod:`.problems` holds what the checks report and its wording.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Mapping

from ..errors import TraceError
from ..trace import TraceSet
from . import groups as group_checks
from . import pairs as pair_checks
from .contract import ATTR_KINDS
from .firsttick import FirstKernels, FirstTick, Roofline, first_tick
from .manifest import CostMemo, check_manifest
from .problems import Problem, Problems
from .ranks import RankSummary, check_rank_number, scan_rank
from .shapes import Shapes
from .verdict import Verdict, decide

__all__ = ["ATTR_KINDS", "FirstTick", "Problem", "Report", "Verdict", "check", "examine", "validate"]


@dataclass(frozen=True, slots=True)
class Report:
    """The problems of a set, and what the simulator will do with it (None when the
    set has defects the simulator cannot run at all).  ``manifest``: the set had one,
    so its costs and group order were checked."""

    problems: list[Problem]
    verdict: Verdict | None
    manifest: bool = True


def validate(trace_set: TraceSet, max_problems: int = 50, costs: dict | None = None) -> list[Problem]:
    """Every defect found in ``trace_set``, at most ``max_problems`` of them.

    When more were found, a last problem (rank None) says how many were left out.
    An empty list means the set is fit for ASTRA-sim.  ``costs``, when given, is
    filled with each rank's :class:`~.manifest.Costs` (what a manifest states of it).

    Python's cyclic garbage collector is paused meanwhile (see :func:`_paused_gc`).
    """
    return examine(trace_set, max_problems, costs).problems


def examine(trace_set: TraceSet, max_problems: int = 50, costs: dict | None = None,
            rooflines: Mapping[str, Roofline] | None = None) -> Report:
    """:func:`validate`'s problems and the replay's verdict.  ``rooflines`` ({GPU name:
    (peak TFLOPS, memory GB/s)}): the verdict also says which ranks the simulator aborts
    at its first tick on them (:mod:`.firsttick`)."""
    with _paused_gc():
        return _examine(trace_set, max_problems, costs, rooflines)


@contextmanager
def _paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector, if it runs, for the duration.

    Reading and checking a set makes and drops millions of objects, none in
    reference cycles, while the decoded nodes shared between ranks stay alive: the
    collector would traverse all of them again and again (about a third of the time
    on a set of a million nodes or more) and free nothing.  Reference counting still
    frees everything as usual; the collector runs again afterwards.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _examine(trace_set: TraceSet, max_problems: int, costs: dict | None,
             rooflines: Mapping[str, Roofline] | None = None) -> Report:
    out = Problems(max_problems)
    groups = group_checks.check_groups(trace_set, out)
    manifest = (trace_set.metadata or {}).get("manifest")
    if manifest is not None:
        group_checks.check_ring_order(trace_set.comm_groups, out)
    runnable = out.total == 0
    firsts = FirstKernels() if rooflines else None
    summaries: dict[int, RankSummary] = {}
    shapes = Shapes(max_problems)
    memo = CostMemo({str(name): len(members) for name, members in trace_set.comm_groups.items()
                     if isinstance(members, (list, tuple))})
    wanted = manifest is not None or costs is not None
    costs = {} if costs is None else costs
    for rank, nodes in trace_set.iter_ranks():
        if check_rank_number(rank, trace_set.world_size, summaries, out):
            summaries[rank] = scan_rank(rank, nodes, groups, trace_set.world_size,
                                        shapes, out)
            if wanted:
                costs[rank] = memo.costs(nodes)
            if firsts is not None:
                firsts.add(rank, nodes)
        else:
            runnable = False
    subset = trace_set.ranks is not None
    for rank in trace_set.ranks if subset else range(trace_set.world_size):
        if rank not in summaries:
            out.at(rank, None, "", "no trace for this rank")
            runnable = False
    group_checks.check_collectives(groups, summaries, out)
    pair_checks.check_point_to_point(summaries, out, subset)
    if manifest is not None:
        check_manifest(manifest, trace_set.world_size, sorted(summaries), costs, out)
    verdict = None
    if runnable and not subset and all(s.program >= 0 for s in summaries.values()):
        verdict = decide(summaries, shapes.programs, groups)
        if verdict.blocked is not None and out.total == 0:
            out.items.append(verdict.blocked)
        if firsts is not None:
            timed = bool(manifest.get("compute_model")) if isinstance(manifest, dict) else False
            tick = first_tick(firsts.of, rooflines, timed)
            if tick is not None:
                verdict = replace(verdict, first_tick=tick)
    return Report(out.result(), verdict, manifest is not None)


def check(trace_set: TraceSet, max_problems: int = 50) -> None:
    """Raise :class:`TraceError` listing the problems of ``trace_set``, if any."""
    problems = validate(trace_set, max_problems)
    if problems:
        raise TraceError(problems)
