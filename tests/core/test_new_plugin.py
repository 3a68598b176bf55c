"""`stage new-plugin`: what it writes, and the mistakes it refuses in one line."""

from __future__ import annotations

import ast

import pytest

from stage_core.api import main
from stage_core.newplugin import KINDS
from stage_core.testing import fresh_host


@pytest.mark.parametrize("kind", KINDS)
def test_a_skeleton_is_a_distribution_with_an_entry_point_and_a_kit_test(kind, tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["new-plugin", "my-thing", "--kind", kind, "-o", str(out)], host=fresh_host()) == 0
    module = f"stage_{kind}_my_thing"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(
        ["README.md", "pyproject.toml", f"{module}/__init__.py", f"{module}/plugin.py", "tests/test_plugin.py"])
    pyproject = (out / "pyproject.toml").read_text()
    assert f'name = "stage-{kind}-my-thing"' in pyproject and f'my-thing = "{module}.plugin"' in pyproject
    for path in (out / module / "plugin.py", out / "tests" / "test_plugin.py"):
        tree = ast.parse(path.read_text())  # valid Python, importing only the public API
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert {m for m in modules if m.startswith("stage_core")} <= {"stage_core.api", "stage_core.testing"}
    assert "stage_core.testing" in (out / "tests" / "test_plugin.py").read_text()


@pytest.mark.parametrize("argv,message", [
    (["new-plugin", "Zero_Bubble", "--kind", "schedule"], "new-plugin 'Zero_Bubble': a plugin name is lowercase"),
    (["new-plugin", "zb", "--kind", "scheduler"], "argument --kind: invalid choice: 'scheduler'"),
])
def test_mistakes_are_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv, host=fresh_host()) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_left_alone(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(["new-plugin", "zb", "--kind", "schedule", "-o", str(tmp_path / "mine")], host=fresh_host()) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
