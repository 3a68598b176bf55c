"""The border guard: in-tree plugins and adapters import only STAGE's public API.

A plugin may import ``stage_core.api`` (whose ``__all__`` is the public surface),
``stage_core.records``, ``stage_core.testing`` and ``hookimpl``/``__version__`` from
``stage_core``; anything else is internal.  This walks every Python file of
``plugins/`` and ``adapters/`` (sources and tests) and lists every other import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stage_core
import stage_core.api as api
import stage_core.records as records
import stage_core.testing as testing

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {
    "stage_core": {"hookimpl", "__version__", "api", "records", "testing"},
    "stage_core.api": set(api.__all__),
    "stage_core.records": {n for n in vars(records) if not n.startswith("_")},
    "stage_core.testing": set(testing.__all__),
}


def _distribution_files() -> list[Path]:
    files = []
    for base in ("plugins", "adapters"):
        for path in sorted((ROOT / base).rglob("*.py")):
            parts = set(path.relative_to(ROOT).parts)
            if parts & {"build", ".tox", "__pycache__"} or any(p.endswith(".egg-info") for p in parts):
                continue
            files.append(path)
    return files


def non_public_imports(path: Path) -> list[str]:
    """Each import of a stage_core name that is not public, as ``module.name (line)``."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "stage_core":
                continue
            allowed = PUBLIC.get(node.module, set())
            bad += [f"{node.module}.{a.name} (line {node.lineno})" for a in node.names if a.name not in allowed]
        elif isinstance(node, ast.Import):
            bad += [f"import {a.name} (line {node.lineno})" for a in node.names
                    if a.name.split(".")[0] == "stage_core" and a.name not in PUBLIC]
    return bad


def test_the_walk_finds_every_distribution():
    dists = {p.relative_to(ROOT).parts[1] for p in _distribution_files()}
    assert {"stage-model-gpt", "stage-parallel", "stage-search", "stage-adapter-chakra"} <= dists


@pytest.mark.parametrize("path", _distribution_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_public_names(path):
    assert non_public_imports(path) == []


def test_the_guard_catches_an_internal_import(tmp_path):
    plugin = tmp_path / "p.py"
    plugin.write_text("from stage_core.api import GraphBuilder\nfrom stage_core.parallel.lower import Lowerer\n"
                      "import stage_core.cli\nfrom stage_core import hookimpl\n")
    assert non_public_imports(plugin) == ["stage_core.parallel.lower.Lowerer (line 2)", "import stage_core.cli (line 3)"]


def test_every_public_name_exists():
    for module, names in PUBLIC.items():
        mod = {"stage_core": stage_core, "stage_core.api": api, "stage_core.records": records,
               "stage_core.testing": testing}[module]
        missing = [n for n in names if not hasattr(mod, n) and n not in ("api", "records", "testing")]
        assert missing == [], module
