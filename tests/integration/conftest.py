import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def stage(*args, cwd=None, env=None):
    """Run the installed ``stage`` command as a user would."""
    exe = shutil.which("stage") or str(Path(sys.executable).parent / "stage")
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="session")
def run_stage():
    """The ``stage`` command: ``run_stage("generate", ...)`` -> CompletedProcess."""
    return stage
