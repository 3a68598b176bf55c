"""`stage validate`'s replay and the real ASTRA-sim on sets that do not all finish: both
must name the same ranks as never finishing (``replay_and_simulate``).

The corpus here: the sets that deadlocked before lowering chained sends and
collectives (kept in data/prechain, written by the generator of that time), today's
tied-embedding pipelines with that chain removed again, and sets broken on purpose
from one generated set: a collective dropped on one rank (in front and at the end of
its group's sequence), a collective's size or type changed on one rank, a send
without its receive, a receive without its send, a dependency cycle.  The plans that
finish (the whole strategy matrix, MoE plans, the tied pipelines) are in
test_simulator.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
from pathlib import Path

import pytest
from conftest import ASTRA_SIM, NO_SIMULATOR

from stage_core.flow import plan_job, read_trace_set, write_trace_set
from stage_core.parallel import Plan
from stage_core.trace import CollectiveType, NodeType, RankProgram
from stage_core.validate import validate

DATA = Path(__file__).parent / "data" / "prechain"
PRECHAIN = sorted(p.name for p in DATA.iterdir() if p.is_dir())

# the tied-embedding pipelines of test_simulator, shrunk
TINY_GPT2 = {"layers": "4", "hidden": "64", "heads": "4", "vocab_size": "512"}
UNCHAINED = [
    ("gpt2-gpipe-pp4", "gpt2", Plan(pp=4, micro_batches=4, schedule="gpipe", seq_len=32)),
    ("gpt2-1f1b-pp4", "gpt2", Plan(pp=4, micro_batches=4, schedule="1f1b", seq_len=32)),
    ("gpt2-interleaved-pp2-tp2", "gpt2",
     Plan(pp=2, tp=2, micro_batches=4, schedule="interleaved", virtual_stages=2, seq_len=32)),
    ("gpt2-interleaved-pp2-tp2-sp-full", "gpt2",
     Plan(pp=2, tp=2, sp=True, micro_batches=4, schedule="interleaved", virtual_stages=2,
          recompute="full", seq_len=32)),
    ("gpt2-1f1b-pp4-dp2-z1", "gpt2",
     Plan(pp=4, dp=2, zero=1, micro_batches=4, schedule="1f1b", recompute="selective", seq_len=32)),
    ("gpt2-gpipe-pp2-dp2-z3", "gpt2", Plan(pp=2, dp=2, zero=3, micro_batches=2, schedule="gpipe",
                                           seq_len=32)),
    ("gpt2-interleaved-pp2-dp4", "gpt2",
     Plan(pp=2, dp=4, micro_batches=4, schedule="interleaved", virtual_stages=2, seq_len=32)),
    ("gpt3-pp4-tp2", "gpt3-175b", Plan(pp=4, tp=2, micro_batches=4, seq_len=32)),
]


@pytest.mark.parametrize("name", PRECHAIN)
def test_the_sets_that_deadlocked_before_the_chain(name, host, tmp_path, replay_and_simulate):
    shutil.copytree(DATA / name, tmp_path / name)  # `stage astrasim` writes beside the traces
    verdict, status, results = replay_and_simulate(tmp_path / name)
    assert not verdict.finishes and status == 1
    assert validate(read_trace_set(host, tmp_path / name)) == [verdict.blocked]  # the one problem
    per_rank_agrees(host, tmp_path / name, verdict)
    assert results["summary"]["finished_ranks"] == 0  # every rank waits


def per_rank_agrees(host, trace_dir: Path, verdict) -> None:
    """The replay with one process per rank gives what one per rank class gave (the
    sets are read as StampedNodes, so this covers linking by a rank's stamp too)."""
    import stage_core.validate as package
    from stage_core.validate.verdict import decide

    real = package.decide
    package.decide = functools.partial(decide, per_class=False)
    try:
        slow = package.examine(read_trace_set(host, trace_dir)).verdict
    finally:
        package.decide = real
    assert not slow.per_class
    assert (slow.unfinished, slow.timing_independent, slow.blocked) == \
        (verdict.unfinished, verdict.timing_independent, verdict.blocked)


def unchained(program: RankProgram) -> RankProgram:
    """``program`` without the control dependencies that chain each send or collective
    to the one emitted before it (where it has data dependencies of its own: without
    them the control dependency orders the schedule's steps too)."""
    nodes, last = [], None
    for node in program.nodes:
        if node.type in (NodeType.COMM_SEND, NodeType.COMM_COLL):
            if last in node.ctrl_deps and node.data_deps:
                node = dataclasses.replace(node, ctrl_deps=tuple(d for d in node.ctrl_deps
                                                                 if d != last))
            last = node.id
        nodes.append(node)
    return RankProgram(program.ranks, tuple(nodes), program.label)


@pytest.mark.parametrize("model,plan", [case[1:] for case in UNCHAINED],
                         ids=[case[0] for case in UNCHAINED])
def test_tied_pipelines_without_the_chain(host, tmp_path, replay_and_simulate, model, plan):
    out = written(host, tmp_path, model, plan, TINY_GPT2, unchained)
    verdict, status, results = replay_and_simulate(out)
    assert status == (0 if verdict.finishes else 1)
    per_rank_agrees(host, out, verdict)


def written(host, tmp_path, model, plan, overrides, change=None, rank=None) -> Path:
    """The set of ``plan``, with ``change`` applied to the program of ``rank`` (taken out
    of its class) or, without a rank, to every program; written unchecked."""
    result = plan_job(host, model, overrides, plan)
    programs = []
    for program in result.job.programs:
        if change is None or (rank is not None and rank not in program.ranks):
            programs.append(program)
        elif rank is None:
            programs.append(change(program))
        else:
            rest = tuple(r for r in program.ranks if r != rank)
            if rest:
                programs.append(RankProgram(rest, program.nodes, program.label))
            programs.append(change(RankProgram((rank,), program.nodes, program.label)))
    job = dataclasses.replace(result.job, programs=tuple(programs))
    out = tmp_path / "set"
    write_trace_set(host, dataclasses.replace(result, job=job), out, validate=False)
    return out


# --------------------------------------------------------------------------- broken on purpose

# 8 ranks: tp 2 x dp 2 x pp 2 (rank = t + 2d + 4s), 2 micro-batches, tied embeddings
BASE = ("gpt2", Plan(tp=2, dp=2, pp=2, micro_batches=2, schedule="1f1b", seq_len=32))


def dropped(kind: NodeType, which: int = 0):
    """Drop the ``which``-th node of ``kind`` (-1: the last); the nodes waiting on it
    wait on what it waited on instead."""
    def change(program: RankProgram) -> RankProgram:
        of_kind = [n for n in program.nodes if n.type == kind]
        gone = of_kind[which]
        above = (*gone.data_deps, *gone.ctrl_deps)
        nodes = []
        for node in program.nodes:
            if node is gone:
                continue
            if gone.id in node.data_deps or gone.id in node.ctrl_deps:
                node = dataclasses.replace(
                    node, data_deps=tuple(d for d in node.data_deps if d != gone.id),
                    ctrl_deps=tuple(sorted({d for d in (*node.ctrl_deps, *above) if d != gone.id}
                                           - set(node.data_deps))))
            nodes.append(node)
        return RankProgram(program.ranks, tuple(nodes), program.label)
    return change


def first_collective(**changes):
    def change(program: RankProgram) -> RankProgram:
        at = next(i for i, n in enumerate(program.nodes) if n.type == NodeType.COMM_COLL)
        nodes = list(program.nodes)
        old = nodes[at]
        nodes[at] = dataclasses.replace(old, **{k: f(old) for k, f in changes.items()})
        return RankProgram(program.ranks, tuple(nodes), program.label)
    return change


def cycle(program: RankProgram) -> RankProgram:
    """The second node also waits on the last: a dependency cycle through all between."""
    nodes = list(program.nodes)
    second = nodes[1]
    nodes[1] = dataclasses.replace(second, ctrl_deps=(*second.ctrl_deps, nodes[-1].id))
    return RankProgram(program.ranks, tuple(nodes), program.label)


BROKEN = [
    # (id, rank, change, every rank finishes)
    ("first-collective-dropped", 3, dropped(NodeType.COMM_COLL, 0), False),
    ("last-collective-dropped", 5, dropped(NodeType.COMM_COLL, -1), False),
    ("collective-size-differs", 2,
     first_collective(comm_size=lambda n: n.comm_size + 4096), False),
    ("collective-type-differs", 6,
     first_collective(comm_type=lambda n: CollectiveType.ALL_GATHER), False),
    ("send-without-receive", 5, dropped(NodeType.COMM_RECV, 0), True),  # sends are eager
    ("receive-without-send", 1, dropped(NodeType.COMM_SEND, -1), False),
    ("dependency-cycle", 4, cycle, False),
]


@pytest.mark.parametrize("rank,change,finish", [case[1:] for case in BROKEN],
                         ids=[case[0] for case in BROKEN])
def test_sets_broken_on_purpose(host, tmp_path, replay_and_simulate, rank, change, finish):
    model, plan = BASE
    out = written(host, tmp_path, model, plan, TINY_GPT2, change, rank)
    verdict, status, results = replay_and_simulate(out)
    assert verdict.finishes == finish
    assert status == (0 if finish else 1)
    per_rank_agrees(host, out, verdict)


def test_stage_astrasim_refuses_a_set_that_deadlocks_and_names_the_ranks(run_stage, tmp_path):
    shutil.copytree(DATA / "gpipe-pp4", tmp_path / "set")
    refused = run_stage("astrasim", tmp_path / "set")
    assert refused.returncode == 1
    assert "rank 0, node 50" in refused.stderr and "never finishes in ASTRA-sim" in refused.stderr
    if not ASTRA_SIM:
        pytest.skip(NO_SIMULATOR)
    ran = run_stage("astrasim", tmp_path / "set", "--no-validate", "--astra-sim", ASTRA_SIM)
    assert ran.returncode == 1  # the simulator itself exits 0
    assert "DEADLOCK: ranks 0-3 never finished (4 of 4)" in ran.stdout
