"""The host checks what plugins return before it lowers anything, and names the plugin.

Each wrong output of a throwaway plugin is refused in one line naming the plugin and its
record (schedule, strategy or model), exit status 1, and no set is written.
"""

from __future__ import annotations

import pytest

from stage_core.api import GraphBuilder, ModelSpec, ScheduleSpec, Shard, StrategySpec, hookimpl, main, one_f_one_b
from stage_core.testing import ToyConfig, build_toy, fresh_host, jsonl_plugin, reference_strategies, toy_plugin


class Schedules:
    def __init__(self, order):
        self.order = order

    @hookimpl
    def stage_schedules(self):
        return [ScheduleSpec("mine", self.order, "a third party's schedule")]


def run(capsys, tmp_path, *plugins, flags=()):
    host = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "reference"), *plugins)
    out = tmp_path / "out"
    status = main(["generate", "--model", "toy", "--format", "jsonl", "-o", str(out), *flags], host=host)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert not out.exists() and not any(tmp_path.iterdir())  # nothing written, nothing left
    return status, lines[0]


def changed_1f1b(change):
    def order(stages, micro_batches, virtual=1):
        steps = [list(s) for s in one_f_one_b(stages, micro_batches, virtual)]
        change(steps)
        return steps
    return order


PIPE = ("--pp", "2", "--micro-batches", "4", "--schedule", "mine")


@pytest.mark.parametrize("change,expected", [
    (lambda s: s[1].__setitem__(2, ("X", 0, 0)),
     "stage 1, step 2: unknown step kind 'X'; known: F, B, W (forward, backward for inputs, weight gradients)"),
    (lambda s: s[1].insert(1, ("F", 0, 0)),
     "stage 1, step 1: F of micro-batch 0, chunk 0 runs twice"),
    (lambda s: s[0].remove(("B", 3, 0)),
     "stage 0: micro-batch 3, chunk 0 has no B step"),
    (lambda s: s[1].insert(0, s[1].pop(s[1].index(("B", 0, 0)))),
     "stage 1, step 0: B of micro-batch 0, chunk 0 comes before its F"),
    (lambda s: s.pop(), "order has 1 step lists for 2 pipeline stages"),
    (lambda s: s[0].insert(0, ("W", 0, 0)),
     "stage 0, step 0: W of micro-batch 0, chunk 0 comes before its B"),
    (lambda s: s[1].__setitem__(1, (("B", 0, 0), ("F", 1, 0))),
     "stage 1, step 1: a pair of steps is a forward and a backward run overlapped, (F, B); got ('B', 'F')"),
])
def test_a_schedule_with_a_wrong_order_is_refused_naming_it(capsys, tmp_path, change, expected):
    status, line = run(capsys, tmp_path, (Schedules(changed_1f1b(change)), "zb-thirdparty"), flags=PIPE)
    assert status == 1
    assert line.startswith("stage: error: plugin 'zb-thirdparty': schedule 'mine': its order for pp 2, 4 "
                           "micro-batches, 1 virtual stage: ")
    assert line.endswith(expected)


def test_a_schedule_that_raises_is_one_line(capsys, tmp_path):
    def order(stages, micro_batches, virtual=1):
        return {}[stages]

    status, line = run(capsys, tmp_path, (Schedules(order), "zb-thirdparty"), flags=PIPE)
    assert (status, line) == (1, "stage: error: plugin 'zb-thirdparty': schedule 'mine': order failed: KeyError: 2")


class Phantom:
    """A strategy that shards the embedding over an axis the mesh does not have."""

    @hookimpl
    def stage_strategies(self):
        def apply(sg, mesh, plan):
            sg.shard_params("tp2", ("V",))
            return sg
        return [StrategySpec("phantom", None, lambda model, plan: [], apply)]


def test_a_phantom_axis_is_refused(capsys, tmp_path):
    status, line = run(capsys, tmp_path, (Phantom(), "phantom"), flags=("--dp", "2"))
    assert status == 1
    assert line == ("stage: error: plugin 'phantom': strategy 'phantom': compute placement of embed.wte names mesh "
                    "axis 'tp2', which the mesh does not have (axes: cp, dp, edp, ep, etp, pp, tp); declare a new "
                    "axis with AxisSpec")


class DegreeWriter:
    @hookimpl
    def stage_strategies(self):
        def apply(sg, mesh, plan):
            sg.degrees["tp"] = 2  # "halve" the parameters without any communication
            return sg
        return [StrategySpec("sneaky", None, lambda model, plan: [], apply)]


def test_the_degree_table_is_the_hosts(capsys, tmp_path):
    status, line = run(capsys, tmp_path, (DegreeWriter(), "sneaky"))
    assert status == 1
    assert line == ("stage: error: plugin 'sneaky': strategy 'sneaky': apply failed: TypeError: the degree table is "
                    "the host's (the plan's degrees); a strategy cannot change it (it tried to set 'tp')")


class WrongDim:
    @hookimpl
    def stage_strategies(self):
        def apply(sg, mesh, plan):
            sg.param_compute[sg.graph.params[0]] = {"dp": Shard("q")}
            return sg
        return [StrategySpec("wrongdim", None, lambda model, plan: [], apply)]


def test_a_placement_on_a_dim_the_tensor_lacks_is_refused(capsys, tmp_path):
    status, line = run(capsys, tmp_path, (WrongDim(), "wrongdim"), flags=("--dp", "2"))
    assert status == 1
    assert line == ("stage: error: plugin 'wrongdim': strategy 'wrongdim': compute placement of embed.wte shards "
                    "dim 'q' on dp, which the tensor [V, h] does not have")


class RaisingStrategy:
    @hookimpl
    def stage_strategies(self):
        def apply(sg, mesh, plan):
            return sg.graph.params[99]
        return [StrategySpec("broken", None, lambda model, plan: [], apply)]


def test_a_raising_strategy_is_one_line(capsys, tmp_path):
    status, line = run(capsys, tmp_path, (RaisingStrategy(), "broken-strategy"))
    assert (status, line) == (1, "stage: error: plugin 'broken-strategy': strategy 'broken': apply failed: "
                                 "IndexError: list index out of range")


class Models:
    def __init__(self, build):
        self.build = build

    @hookimpl
    def stage_models(self):
        return [ModelSpec("custom", "custom", self.build, {"custom": ToyConfig(name="custom")},
                          ToyConfig.from_dict)]


def run_model(capsys, tmp_path, build):
    host = fresh_host((Models(build), "custom-models"), (jsonl_plugin, "jsonl"))
    out = tmp_path / "out"
    status = main(["generate", "--model", "custom", "--format", "jsonl", "-o", str(out)], host=host)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and not out.exists()
    return status, lines[0]


def test_a_raising_model_build_is_one_line(capsys, tmp_path):
    def build(config):
        raise ZeroDivisionError("division by zero")

    assert run_model(capsys, tmp_path, build) == (
        1, "stage: error: plugin 'custom-models': model family 'custom': build failed: ZeroDivisionError: "
           "division by zero")


def test_a_model_without_a_loss_is_refused(capsys, tmp_path):
    def build(config):
        graph = build_toy(config)
        graph.loss = None
        return graph

    assert run_model(capsys, tmp_path, build) == (
        1, "stage: error: plugin 'custom-models': model family 'custom': graph 'custom' has no loss (end the model "
           "with GraphBuilder.finish(loss))")


def test_a_model_returning_no_graph_is_refused(capsys, tmp_path):
    assert run_model(capsys, tmp_path, lambda config: {"ops": []}) == (
        1, "stage: error: plugin 'custom-models': model family 'custom': build returned a dict, not a Graph "
           "(GraphBuilder.finish gives one)")


def test_an_unknown_kernel_is_refused(capsys, tmp_path):
    def build(config):
        g = GraphBuilder("custom", dims={"h": 8})
        x = g.input("x", ("b", "s", "h"), dtype="bf16")
        y, = g.op("mystery", "bsh->bsh", [x], name="odd", fn="warp")
        return g.finish(y)

    assert run_model(capsys, tmp_path, build) == (
        1, "stage: error: plugin 'custom-models': model family 'custom': graph 'custom': op odd is kernel "
           "'mystery/warp', which neither the core nor the model's registered kernels (ModelSpec.kernels) know")


def test_the_traceback_is_printed_with_stage_debug(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STAGE_DEBUG", "1")
    host = fresh_host((Models(lambda c: 1 / 0), "custom-models"), (jsonl_plugin, "jsonl"))
    assert main(["report", "--model", "custom"], host=host) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError" in err
    assert err.strip().splitlines()[-1].startswith("stage: error: plugin 'custom-models': model family 'custom': "
                                                   "build failed: ZeroDivisionError")


def test_a_hook_returning_the_wrong_record_is_named(capsys):
    class Wrong:
        @hookimpl
        def stage_schedules(self):
            return ["gpipe"]

    assert main(["plugins"], host=fresh_host((Wrong(), "wrong"))) == 1
    assert capsys.readouterr().err.strip() == ("stage: error: plugin 'wrong': stage_schedules returned a str, not a "
                                               "ScheduleSpec")
