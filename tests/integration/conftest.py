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


# --------------------------------------------------------------------------- the real simulator

#: ASTRA-sim's analytical binary; .ci/run sets it from ../shared/astra-sim
ASTRA_SIM = os.environ.get("ASTRA_SIM_BIN")
NO_SIMULATOR = ("ASTRA_SIM_BIN is not set: no ASTRA-sim analytical binary on this machine "
                "(CI sets it from ../shared/astra-sim)")


def simulate_set(trace_dir, system="h100"):
    """Run ``trace_dir`` through the real simulator: (exit status of `stage astrasim`, results.json).

    Skips the calling test when no simulator is configured.
    """
    import io
    import json

    from stage_adapter_astrasim.command import run_astrasim

    if not ASTRA_SIM:
        pytest.skip(NO_SIMULATOR)
    out, err = io.StringIO(), io.StringIO()
    status = run_astrasim(trace_dir, astra_sim=ASTRA_SIM, system=system, as_json=True, out=out, err=err)
    return status, json.loads(out.getvalue())


@pytest.fixture(scope="session")
def simulate():
    """``simulate(dir)`` -> (status, results); every rank must print "finished" for status 0."""
    return simulate_set


@pytest.fixture(scope="session")
def host():
    from stage_core.plugins import PluginHost

    return PluginHost()


@pytest.fixture
def write_set(host, tmp_path):
    """``write_set(model, plan, **overrides)`` -> the folder of a generated, validated set."""
    from stage_core.api import plan_job, write_trace_set

    made = []

    def write(model, plan, **overrides):
        out = tmp_path / f"set{len(made)}"
        result = plan_job(host, model, {k: str(v) for k, v in overrides.items()}, plan)
        write_trace_set(host, result, out)
        made.append(out)
        return out

    return write
