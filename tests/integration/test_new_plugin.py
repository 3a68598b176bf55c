"""Each skeleton of `stage new-plugin` installs with pip into a new environment (on top of
the installed core) and its own tests, which use the conformance kit, pass as written."""

from __future__ import annotations

import subprocess

import pytest

from conftest import child_python, stage
from stage_core.newplugin import KINDS


@pytest.mark.parametrize("kind", KINDS)
def test_the_skeleton_installs_and_passes(kind, tmp_path):
    target = tmp_path / f"stage-{kind}-demo"
    made = stage("new-plugin", "demo", "--kind", kind, "-o", target)
    assert made.returncode == 0, made.stderr
    python = child_python(tmp_path)
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", target],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-2000:]
    listed = subprocess.run([python, "-m", "stage_core.cli", "plugins", "--json"], capture_output=True, text=True)
    assert '"name": "demo"' in listed.stdout  # found through its entry point
    tests = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", target / "tests"],
                           capture_output=True, text=True, cwd=target)
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout
