"""The hooks for schedules, commands and Hugging Face import, through the host and the CLI."""

import json

import pytest

from stage_core import hookimpl
from stage_core.cli import main
from stage_core.errors import UsageError
from stage_core.records import CommandSpec, ScheduleSpec
from stage_core.schedule import gpipe, interleaved_1f1b, one_f_one_b
from stage_core.testing import ToyConfig, fresh_host, jsonl_plugin, toy_plugin


# --------------------------------------------------------------------------- stage_schedules


def test_builtin_schedules_are_registered_and_a_plugin_can_add_one():
    class Reverse:
        @hookimpl
        def stage_schedules(self):
            return [ScheduleSpec("backwards-first", lambda p, m, v: [[("B", 0, 0)]] * p)]

    host = fresh_host((Reverse(), "reverse"))
    names = {s.name: s.plugin for s in host.schedules()}
    assert names == {"gpipe": "stage_core.schedule.builtin", "1f1b": "stage_core.schedule.builtin",
                     "interleaved": "stage_core.schedule.builtin", "backwards-first": "reverse"}


@pytest.mark.parametrize("p,m", [(4, 8), (2, 2), (8, 3)])
def test_1f1b_warms_up_with_p_minus_i_minus_1_forwards(p, m):
    """PipeDream-flush (Narayanan et al. 2021, Fig. 4): stage i runs min(p-i-1, m) forwards first."""
    for i, order in enumerate(one_f_one_b(p, m)):
        assert sorted(order) == sorted([("F", k, 0) for k in range(m)] + [("B", k, 0) for k in range(m)])
        warm = 0
        while warm < len(order) and order[warm][0] == "F":
            warm += 1
        assert warm == min(p - i - 1, m) + (1 if p - i - 1 < m else 0)
        # never more than p - i micro-batches in flight (activations held)
        live = peak = 0
        for kind, _, _ in order:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(p - i, m)


def test_gpipe_and_interleaved_orders():
    assert gpipe(2, 2)[0] == [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("B", 1, 0)]
    order = interleaved_1f1b(2, 4, 2)
    for stage in order:
        assert sorted(stage) == sorted((k, mb, c) for k in "FB" for mb in range(4) for c in range(2))
    with pytest.raises(UsageError, match="multiple of pp"):
        interleaved_1f1b(4, 6, 2)


def test_unknown_schedule_is_a_usage_error(capsys):
    host = fresh_host((toy_plugin, "toy"))
    assert main(["report", "--model", "toy", "--schedule", "zigzag"], host=host) == 2
    assert "--schedule zigzag" in capsys.readouterr().err


# --------------------------------------------------------------------------- stage_commands


class Hello:
    @hookimpl
    def stage_commands(self):
        def configure(p):
            p.add_argument("who")

        def run(args):
            print(f"hello {args.who}")
            return 3

        return [CommandSpec("hello", "say hello", configure, run)]


def test_a_plugin_command_runs_and_returns_its_status(capsys):
    host = fresh_host((Hello(), "hello-plugin"))
    assert main(["hello", "world"], host=host) == 3
    assert capsys.readouterr().out == "hello world\n"


def test_a_plugin_command_may_not_shadow_a_core_one(capsys):
    class Shadow:
        @hookimpl
        def stage_commands(self):
            return [CommandSpec("generate", "oops", lambda p: None, lambda a: 0)]

    assert main(["plugins"], host=fresh_host((Shadow(), "shadow"))) == 2
    assert "'shadow'" in capsys.readouterr().err


# --------------------------------------------------------------------------- stage_config_from_hf


class ToyHF:
    @hookimpl
    def stage_config_from_hf(self, hf_config):
        if hf_config.get("model_type") != "toy":
            return None
        return ToyConfig(name="from-hf", layers=hf_config["num_hidden_layers"])


class Fallback:
    @hookimpl(trylast=True)
    def stage_config_from_hf(self, hf_config):
        return ToyConfig(name="fallback")


def test_first_plugin_that_answers_wins_and_trylast_yields(tmp_path, capsys):
    host = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (Fallback(), "fallback"), (ToyHF(), "toy-hf"))
    assert host.config_from_hf({"model_type": "toy", "num_hidden_layers": 3}).name == "from-hf"
    assert host.config_from_hf({"model_type": "other"}).name == "fallback"
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "toy", "num_hidden_layers": 3}))
    assert main(["report", "--model", str(path), "--json"], host=host) == 0
    assert json.loads(capsys.readouterr().out)["model"]["layers"] == 3


def test_a_config_nobody_handles_lists_the_supported_types(tmp_path, capsys):
    host = fresh_host((toy_plugin, "toy"), (ToyHF(), "toy-hf"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert"}))
    assert main(["report", "--model", str(path)], host=host) == 2
    err = capsys.readouterr().err
    assert "'bert'" in err and "supported model_types" in err


def test_a_broken_json_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert main(["report", "--model", str(path)], host=fresh_host((toy_plugin, "toy"))) == 2
    assert "not valid JSON" in capsys.readouterr().err


# --------------------------------------------------------------------------- stage_executors


def _square(x):
    return x * x


def test_an_executor_plugin_is_found_by_name_and_runs_every_item():
    from stage_core.errors import PluginError, UsageError
    from stage_core.records import ExecutorSpec

    class Serial:
        @hookimpl
        def stage_executors(self):
            def run(fn, items, options):
                for i in reversed(range(len(items))):  # results may arrive in any order
                    yield i, fn(items[i])
            return [ExecutorSpec("serial", run, "one after the other")]

    host = fresh_host((Serial(), "serial-plugin"))
    spec = host.executor("serial")
    assert spec.plugin == "serial-plugin"
    assert dict(spec.run(_square, [1, 2, 3, 12], {})) == {0: 1, 1: 4, 2: 9, 3: 144}
    with pytest.raises(UsageError, match=r"--executor ray: unknown executor; known: serial"):
        host.executor("ray")

    class Clash:
        @hookimpl
        def stage_executors(self):
            return [ExecutorSpec("serial", lambda fn, items, options: iter(()))]

    with pytest.raises(PluginError, match="'serial-plugin' and 'clash'"):
        fresh_host((Serial(), "serial-plugin"), (Clash(), "clash")).executors()


# --------------------------------------------------------------------------- stage_simulators


def test_a_simulator_plugin_is_found_by_name_says_whether_it_can_run_and_is_listed(tmp_path, capsys):
    from stage_core.errors import UsageError
    from stage_core.records import SimulatorSpec

    class Fake:
        @hookimpl
        def stage_simulators(self):
            def simulate(directory, hardware):  # a "simulator" that reads the set's manifest
                world = json.loads((directory / "manifest.json").read_text())["world_size"]
                return {"step_time_s": 0.5 * world, "finished": True}
            return [SimulatorSpec("fake", simulate, lambda: None, description="reads the manifest"),
                    SimulatorSpec("absent", simulate, lambda: "its binary is not installed")]

    host = fresh_host((Fake(), "fake-sim"))
    assert [s.name for s in host.simulators()] == ["absent", "fake"]
    assert host.simulator("absent").available() == "its binary is not installed"
    (tmp_path / "manifest.json").write_text('{"world_size": 8}')
    fake = host.simulator("fake")
    assert fake.plugin == "fake-sim" and fake.available() is None
    assert fake.simulate(tmp_path, None) == {"step_time_s": 4.0, "finished": True}
    with pytest.raises(UsageError, match="--simulator gem5: unknown simulator; known: absent, fake"):
        host.simulator("gem5")
    assert main(["plugins", "--json"], host=host) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["fake-sim"]["provides"]["simulators"] == ["absent", "fake"]


# --------------------------------------------------------------------------- stage_estimators


def test_an_estimator_plugin_is_found_by_name_guarded_and_listed(capsys):
    from stage_core.errors import PluginError
    from stage_core.guard import PluginFault
    from stage_core.parallel import Plan
    from stage_core.records import EstimatorSpec

    class Serial:
        """Compute only: the busiest class's kernels one after the other (counted by hand: its
        compute nodes' FLOPs at 1 PFLOP/s)."""

        @hookimpl
        def stage_estimators(self):
            def serial(result, hardware):
                flops = max(sum(n.num_ops for n in p.nodes if n.type == 4) for p in result.job.programs)
                return {"step_time_s": flops / 1e15}

            def broken(result, hardware):
                raise ZeroDivisionError("no GPU")

            return [EstimatorSpec("serial", serial, "compute only"), EstimatorSpec("broken", broken)]

    host = fresh_host((toy_plugin, "toy"), (Serial(), "serial-est"))
    assert [e.name for e in host.estimators()] == ["broken", "serial"]
    from stage_core.flow import plan_job

    result = plan_job(host, "toy", {}, Plan())
    est = host.estimator("serial")
    assert est.plugin == "serial-est"
    flops = result.manifest["rank_classes"][0]["flops"]["total"]
    # the program writes the embedding gather (no arithmetic) with num_ops 1 (design.md, "Units and numbers")
    assert est.estimate(result, None) == {"step_time_s": (flops + 1) / 1e15}
    with pytest.raises(PluginFault, match=r"plugin 'serial-est'.*estimator 'broken'.*ZeroDivisionError: no GPU"):
        host.estimator("broken").estimate(result, None)
    with pytest.raises(UsageError, match=r"--estimator guess: unknown estimator; known: broken, serial"):
        host.estimator("guess")
    with pytest.raises(UsageError, match=r"known: none installed \(install stage-search\)"):
        fresh_host().estimator("replay")

    class Clash:
        @hookimpl
        def stage_estimators(self):
            return [EstimatorSpec("serial", lambda result, hardware: {"step_time_s": 1.0})]

    with pytest.raises(PluginError, match="estimator name 'serial' is registered by two plugins: 'serial-est' and 'clash'"):
        fresh_host((Serial(), "serial-est"), (Clash(), "clash")).estimators()
    assert main(["plugins", "--json"], host=host) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["serial-est"]["provides"]["estimators"] == ["broken", "serial"]
