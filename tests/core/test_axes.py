"""Axes a strategy carves out of another (AxisSpec): the mesh's groups along them, the host's
degree table and checks, propagation over them, and lowering's gradient sync over a split axis
(a reduce-scatter inside the part that shards, an all-reduce of the shard across the rest),
written against the public API by a third party's strategy (stage-strategy-hsdp is one)."""

from __future__ import annotations

import numpy as np
import pytest

from stage_core.api import (FLAT, AxisSpec, CollectiveType, Mesh, NodeType, OptionSpec, Plan, Replicate, Shard,
                            StrategySpec, UsageError, hookimpl, main, param_counts, plan_job, replay)
from stage_core.testing import fresh_host, jsonl_plugin, reference_strategies, toy_plugin


# --------------------------------------------------------------------------- the mesh


def test_groups_along_the_parts_of_a_split_axis_by_hand():
    # tp 2, dp 8 (stride 2), pp 2: dp split into dps (its 4 fastest: stride 2) and dpr (2: stride 8)
    m = Mesh({"tp": 2, "dp": 8, "pp": 2}, parts={"dp": ("dps", 4, "dpr")})
    assert m.group_members("dps", 0) == [0, 2, 4, 6] and m.group_members("dps", 9) == [9, 11, 13, 15]
    assert m.group_members("dpr", 0) == [0, 8] and m.group_members("dpr", 22) == [22, 30]
    assert m.group_members("dp", 0) == [0, 2, 4, 6, 8, 10, 12, 14]  # the parent spans both parts
    assert m.group_members("tp", 5) == [4, 5] and m.group_members("pp", 3) == [3, 19]
    assert (m.group_size("dps"), m.num_groups("dps"), m.group_size("dpr"), m.num_groups("dpr")) == (4, 8, 2, 16)
    assert [m.coord(r, "dp") for r in (0, 2, 8, 14)] == [0, 1, 4, 7]  # dp keeps its own coordinate
    assert [m.coord(r, "dps") for r in (0, 2, 8, 14)] == [0, 1, 0, 3]
    assert m.key(["dpr", "cp", "dps"]) == "cp+dps+dpr"
    # the groups of every key partition the world; a rank's id is its group's
    ranks = np.arange(32)
    for key in ("dps", "dpr", "dp+tp"):
        rows = m.all_group_members(key)
        assert sorted(rows.ravel().tolist()) == list(range(32))
        assert [m.group_index(key, r) for r in ranks] == m.group_index_array(key, ranks).tolist()
        assert all(rows[m.group_index(key, r)].tolist() == m.group_members(key, r) for r in ranks)


def test_a_part_that_is_all_of_its_axis_names_the_axis_groups():
    m = Mesh({"dp": 8}, parts={"dp": ("dps", 8, "dpr")})
    assert m.canonical("dps") == "dp" and m.group_members("dps", 3) == list(range(8))


# --------------------------------------------------------------------------- a third party's strategy

class Hybrid:
    """ZeRO-3 inside groups of --group ranks of dp, replicated across: the core's pieces only."""

    def __init__(self, within="dp", name="dps", rest="dpr", option="group"):
        self.axis = AxisSpec(name, within=within, option=option, rest=rest)
        self.option = option

    @hookimpl
    def stage_strategies(self):
        def apply(sg, mesh, plan):
            if plan.option("group", 1) > 1:
                sg.grad_target["dps"], sg.grad_target["dpr"] = Shard(FLAT), Replicate()
                sg.grad_storage_sharded.add("dps")
                sg.optimizer_sharded.add("dps")
                for p in sg.graph.params:
                    sg.param_storage[p] = {**sg.storage_layout(p), "dps": Shard(FLAT)}
            return sg
        return [StrategySpec("hybrid", None, lambda model, plan: [], apply, order=42,
                             options=(OptionSpec(self.option, int, 1, "ranks a group"),), axes=(self.axis,))]


def host_with(*plugins):
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"), *plugins)


def test_lowering_reduce_scatters_in_the_group_and_all_reduces_the_shard_across(tmp_path):
    host = host_with((Hybrid(), "hybrid"))
    dp, n, m = 8, 4, 2
    result = plan_job(host, "toy", {"layers": "2"}, Plan(dp=dp, micro_batches=m).with_options(group=n))
    psi = param_counts(result.forward)[0]
    assert result.manifest["plan"]["axes"] == {"dps": 4, "dpr": 2}
    (program,) = result.job.programs
    colls = [node for node in program.nodes if node.type == NodeType.COMM_COLL]
    groups = {node.group for node in colls}
    assert groups == {"dps", "dpr"}
    assert [result.job.comm_groups[result.job.group_name(0, k)] for k in ("dps", "dpr")] == [[0, 1, 2, 3], [0, 4]]
    rs = [x for x in colls if x.comm_type == CollectiveType.REDUCE_SCATTER]
    ar = [x for x in colls if x.comm_type == CollectiveType.ALL_REDUCE]
    ag = [x for x in colls if x.comm_type == CollectiveType.ALL_GATHER]
    padded = -(-psi // n) * n
    assert sum(x.comm_size for x in rs) == 2 * padded  # the bf16 gradients, once, inside the group of 4
    assert sum(x.comm_size for x in ar) == 2 * padded // n  # the shard, across the 2 replicas
    assert {x.group for x in rs} == {"dps"} and {x.group for x in ar} == {"dpr"} and {x.group for x in ag} == {"dps"}
    # each all-reduce waits on its bucket's reduce-scatter
    assert all(any(r.id in x.data_deps for r in rs) for x in ar)
    # ZeRO-3 inside the group: each unit gathered before every micro-batch's forward and backward, its shard
    assert sum(x.comm_size for x in ag) == 2 * m * (2 * psi // n)
    mem = result.manifest["rank_classes"][0]["memory_bytes"]
    assert (mem["parameters"], mem["gradients"], mem["optimizer"]) == (2 * psi // n, 2 * padded // n,
                                                                      12 * padded // n)
    # the set validates (group members, pairs) and every rank finishes in the replay
    from stage_core.api import examine_trace_set, read_trace_set, write_trace_set

    report = examine_trace_set(read_trace_set(host, write_trace_set(host, result, tmp_path / "set", "jsonl")))
    assert report.problems == [] and report.verdict.finishes


def test_without_its_option_the_axis_is_off():
    host = host_with((Hybrid(), "hybrid"))
    result = plan_job(host, "toy", {"layers": "2"}, Plan(dp=8))
    assert "axes" not in result.manifest["plan"]
    assert {n.group for p in result.job.programs for n in p.nodes if n.type == NodeType.COMM_COLL} == {"dp"}


# --------------------------------------------------------------------------- the host's checks


def run(capsys, *plugins, flags):
    status = main(["report", "--model", "toy", *flags], host=host_with(*plugins))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return status, lines[0]


def test_a_degree_that_does_not_divide_its_axis_is_the_users(capsys):
    status, line = run(capsys, (Hybrid(), "hybrid"), flags=("--dp", "8", "--group", "3"))
    assert status == 2
    assert line == ("stage: error: --group 3: the dps axis is carved out of dp (--dp 8); it must divide 8 (valid: 1, "
                    "2, 4, 8)")


@pytest.mark.parametrize("kwargs,expected", [
    ({"within": "xp"}, "axis 'dps' is carved out of 'xp', which is not an axis of the ranks (one of tp, cp, dp, pp)"),
    ({"name": "tp"}, "axis name 'tp' is taken (by the mesh's own axes); give the AxisSpec another name (or rest)"),
    ({"rest": "dps"}, "axis name 'dps' is taken (by strategy 'hybrid'); give the AxisSpec another name (or rest)"),
    ({"name": "Shard+1"}, "axis name 'Shard+1': lower-case letters, digits and '_', a letter first"),
    ({"option": "nope"}, "axis 'dps' takes its degree from option 'nope', which the strategy does not declare as an "
                         "int OptionSpec"),
])
def test_an_axis_that_cannot_be_one_is_the_strategys(capsys, kwargs, expected):
    plugin = Hybrid(**kwargs)
    if "option" in kwargs:  # the option the axis names is missing: declare another one
        plugin.option = "group"
    status, line = run(capsys, (plugin, "hybrid"), flags=("--dp", "8", "--group", "2"))
    assert status == 1
    assert line == f"stage: error: plugin 'hybrid': strategy 'hybrid': {expected}"


def test_placements_on_the_new_axis_pass_the_hosts_check_only_when_it_is_on(capsys):
    class Eager(Hybrid):
        @hookimpl
        def stage_strategies(self):
            (spec,) = super().stage_strategies()

            def apply(sg, mesh, plan):
                sg.grad_target["dps"] = Shard(FLAT)  # whether or not the plan turns the axis on
                return sg
            return [StrategySpec("hybrid", None, spec.validate, apply, options=spec.options, axes=spec.axes)]

    assert main(["report", "--model", "toy", "--dp", "8", "--group", "2"], host=host_with((Eager(), "hybrid"))) == 0
    capsys.readouterr()
    status, line = run(capsys, (Eager(), "hybrid"), flags=("--dp", "8"))
    assert status == 1 and "gradient target on mesh axis 'dps', which the mesh does not have" in line


def test_two_axes_splitting_one_are_refused_in_one_line(capsys):
    class Other(Hybrid):
        @hookimpl
        def stage_strategies(self):
            return [StrategySpec("other", None, lambda model, plan: [], lambda sg, mesh, plan: sg,
                                 options=(OptionSpec("other-group", int, 1, "ranks a group"),),
                                 axes=(AxisSpec("dpo", within="dp", option="other-group"),))]

    status, line = run(capsys, (Hybrid(), "hybrid"), (Other(), "other"),
                       flags=("--dp", "8", "--group", "2", "--other-group", "4"))
    assert status == 2
    assert line == "stage: error: --other-group 4 and --group both split dp; give one"
