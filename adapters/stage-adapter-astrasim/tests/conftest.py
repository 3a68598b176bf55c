"""Shared fixtures: the ASTRA-sim sample files, minimal trace sets, a fake simulator."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from stage_core import hookimpl
from stage_core.testing import fresh_host

from astrasim_test_presets import TEST_PRESETS

DATA = Path(__file__).parent / "data"

class _Hardware:
    @staticmethod
    @hookimpl
    def stage_hardware():
        return list(TEST_PRESETS.values())


@pytest.fixture
def host():
    """A plugin host whose only hardware presets are TEST_PRESETS."""
    return fresh_host((_Hardware(), "test-hardware"))


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def sample_stdout() -> str:
    return (DATA / "stdout.txt").read_text()


@pytest.fixture
def make_trace_set(tmp_path):
    """make_trace_set(world=8) -> a DIR with manifest, comm groups and empty traces."""

    def make(world: int = 8, name: str = "traces") -> Path:
        root = tmp_path / name
        root.mkdir()
        (root / "manifest.json").write_text(json.dumps({"world_size": world}))
        (root / "comm_groups.json").write_text(json.dumps({"1": list(range(world))}))
        for rank in range(world):
            (root / f"trace.{rank}.et").write_bytes(b"")
        return root

    return make


@pytest.fixture
def fake_simulator(tmp_path):
    """fake_simulator(stdout_text, returncode=0) -> path of an executable script.

    The script prints ``stdout_text`` and records its argv in ``argv.json`` in its
    working directory.
    """

    def make(stdout_text: str, returncode: int = 0, name: str = "fake_astrasim") -> Path:
        payload = tmp_path / f"{name}.out"
        payload.write_text(stdout_text)
        script = tmp_path / name
        script.write_text(
            f"#!{sys.executable}\n"
            "import json, sys\n"
            "json.dump(sys.argv, open('argv.json', 'w'))\n"
            f"sys.stdout.write(open({str(payload)!r}).read())\n"
            "sys.stderr.write('fake stderr\\n')\n"
            f"sys.exit({returncode})\n")
        script.chmod(0o755)
        return script

    return make
