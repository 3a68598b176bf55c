"""Every hook of the plugin contract is documented and exercised by some test."""

import inspect
from pathlib import Path

from stage_core import hookspecs

HOOKS = [name for name, f in vars(hookspecs).items() if name.startswith("stage_") and inspect.isfunction(f)]
TESTS = Path(__file__).resolve().parents[1]


def test_the_contract_has_the_hooks_the_architecture_names():
    assert set(HOOKS) >= {"stage_models", "stage_config_from_hf", "stage_strategies", "stage_schedules",
                          "stage_trace_backends", "stage_commands"}


def test_every_hook_documents_its_return_value_and_an_example():
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert ":return:" in doc and "Example::" in doc and "@hookimpl" in doc, name


def test_every_hook_has_a_test_of_its_own():
    sources = "\n".join(p.read_text() for p in TESTS.rglob("test_*.py") if p.name != "test_hookspecs.py")
    sources += (TESTS.parent / "stage_core" / "testing.py").read_text()
    untested = [name for name in HOOKS if name not in sources]
    assert not untested, f"hooks no test implements or calls: {untested}"
