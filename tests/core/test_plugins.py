"""The plugin host: discovery, clashes, blocking, broken plugins."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from stage_core import hookimpl
from stage_core.cli import main
from stage_core.errors import PluginError
from stage_core.records import ModelSpec, StrategySpec
from stage_core.testing import ToyConfig, build_toy, fresh_host, toy_plugin


class Throwaway:
    @hookimpl
    def stage_strategies(self):
        return [StrategySpec("throwaway", None, lambda g, p: [], lambda sg, m, p: sg)]


def test_a_registered_plugin_shows_up_in_stage_plugins(capsys):
    host = fresh_host((Throwaway(), "throwaway-plugin"))
    assert main(["plugins", "--json"], host=host) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["throwaway-plugin"]["provides"] == {"strategies": ["throwaway"]}
    assert main(["plugins"], host=host) == 0
    assert "throwaway-plugin" in capsys.readouterr().out


def test_a_name_clash_names_both_plugins():
    class Twin:
        @hookimpl
        def stage_models(self):
            return [ModelSpec("toy", "toy", build_toy, {"toy": ToyConfig()}, ToyConfig.from_dict)]

    host = fresh_host((toy_plugin, "first-toy"), (Twin(), "second-toy"))
    with pytest.raises(PluginError) as err:
        host.models()
    assert "'first-toy'" in str(err.value) and "'second-toy'" in str(err.value)


def test_a_blocked_plugin_disappears(capsys):
    host = fresh_host((toy_plugin, "toy"), (Throwaway(), "throwaway-plugin"), disabled=["throwaway-plugin"])
    assert [s.name for s in host.strategies()] == []
    assert main(["plugins", "--json"], host=host) == 0
    active = [p["name"] for p in json.loads(capsys.readouterr().out) if p["source"] != "blocked"]
    assert "throwaway-plugin" not in active and "toy" in active


def test_a_misspelled_hook_is_an_error():
    class Misspelled:
        @hookimpl
        def stage_modles(self):
            return []

    with pytest.raises(PluginError, match="stage_modles"):
        fresh_host((Misspelled(), "typo"))


def _fake_distribution(root, name, module_source, ep_name):
    """A real installed distribution (dist-info + module) that importlib.metadata discovers."""
    dist = root / f"{name.replace('-', '_')}-0.1.dist-info"  # folder names use underscores
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[stage]\n{ep_name} = {name.replace('-', '_')}\n")
    (root / f"{name.replace('-', '_')}.py").write_text(textwrap.dedent(module_source))


def _stage(args, path, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(env_extra or {})
    code = "import sys; from stage_core.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)


def test_entry_point_plugins_are_discovered_blocked_and_broken_ones_named(tmp_path):
    _fake_distribution(tmp_path, "stage-fake-good", """
        from stage_core import hookimpl
        from stage_core.records import StrategySpec

        @hookimpl
        def stage_strategies():
            return [StrategySpec("fake-strategy", None, lambda g, p: [], lambda sg, m, p: sg)]
    """, "fake-good")
    _fake_distribution(tmp_path, "stage-fake-broken", """
        raise RuntimeError("this plugin is broken on purpose")
    """, "fake-broken")

    out = _stage(["plugins"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "fake-good" in out.stdout and "fake-strategy" in out.stdout
    assert "fake-broken" in out.stdout and "this plugin is broken on purpose" in out.stdout

    blocked = _stage(["plugins", "--json"], tmp_path, {"STAGE_DISABLE_PLUGINS": "fake-good"})
    active = [p["name"] for p in json.loads(blocked.stdout) if p["source"] != "blocked"]
    assert "fake-good" not in active

    # an unrelated command still works; a command that needs a model names the broken plugin
    assert _stage(["validate", "--help"], tmp_path).returncode == 0
    missing = _stage(["report", "--model", "no-such-model"], tmp_path)
    assert missing.returncode == 2
    assert "fake-broken" in missing.stderr and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
