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


def simulate_set(trace_dir, system="h100", validate=True):
    """Run ``trace_dir`` through the real simulator: (exit status of `stage astrasim`, results.json).

    Skips the calling test when no simulator is configured.  ``validate=False`` runs
    a set `stage astrasim` would refuse (its `--no-validate`).
    """
    import io
    import json

    from stage_adapter_astrasim.command import run_astrasim

    if not ASTRA_SIM:
        pytest.skip(NO_SIMULATOR)
    out, err = io.StringIO(), io.StringIO()
    status = run_astrasim(trace_dir, astra_sim=ASTRA_SIM, system=system, as_json=True, out=out, err=err,
                          validate=validate)
    return status, json.loads(out.getvalue())


@pytest.fixture(scope="session")
def simulate():
    """``simulate(dir)`` -> (status, results); every rank must print "finished" for status 0."""
    return simulate_set


@pytest.fixture(scope="session")
def replay_and_simulate(host):
    """``replay_and_simulate(dir)`` -> (verdict, status, results): `stage validate`'s
    replay and the real simulator on one set; fails unless both name the same ranks
    as never finishing.  Where mlcommons/chakra is installed, its reader must also
    decode every node as ours does (outside_reader)."""
    from outside_reader import chakra_reader, compare_with_chakra

    from stage_core.flow import read_trace_set
    from stage_core.validate import examine

    chakra = chakra_reader()

    def run(trace_dir):
        if not ASTRA_SIM:
            pytest.skip(NO_SIMULATOR)
        if chakra is not None:
            compare_with_chakra(host, trace_dir, chakra)
        verdict = examine(read_trace_set(host, trace_dir)).verdict
        status, results = simulate_set(trace_dir, validate=False)  # it may deadlock
        stuck = results["summary"]["deadlocked_ranks"]
        assert verdict is not None, "the replay did not run"
        assert list(verdict.unfinished) == stuck, (
            f"the replay says ranks {list(verdict.unfinished)} never finish, "
            f"the simulator {stuck}")
        return verdict, status, results

    return run


@pytest.fixture(scope="session")
def host():
    from stage_core.plugins import PluginHost

    return PluginHost()


@pytest.fixture
def write_set(host, tmp_path):
    """``write_set(model, plan, **overrides)`` -> the folder of a generated, validated set."""
    from stage_core.flow import plan_job, write_trace_set

    made = []

    def write(model, plan, **overrides):
        out = tmp_path / f"set{len(made)}"
        result = plan_job(host, model, {k: str(v) for k, v in overrides.items()}, plan)
        write_trace_set(host, result, out)
        made.append(out)
        return out

    return write


def child_python(tmp_path):
    """The Python of a new environment that sees this one's packages (the core, pip, setuptools) through
    a .pth file: a distribution installs into it with no download and no build isolation."""
    import sysconfig

    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True)
    python = env / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "parent.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return python


def pytest_terminal_summary(terminalreporter, config):
    """The fuzz tests' counts per category (test_fuzz_*.py) and the htsim steps against the
    analytical ones (test_htsim.py), after the run."""
    for key in ("fuzz_counts", "htsim_rows"):
        for line in config.__dict__.pop(key, []):  # (once, if both conftests load)
            terminalreporter.write_line(line)
