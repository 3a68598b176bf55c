"""Find the ASTRA-sim analytical binary, spell its command line, run it.

Flags are those of the analytical frontends' parser (astra-sim
``astra-sim/network_frontend/analytical/common/CmdLineParser.cc``):
``--workload-configuration`` (trace prefix; files are ``<prefix>.<rank>.et``),
``--comm-group-configuration``, ``--system-configuration``,
``--remote-memory-configuration``, ``--network-configuration``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from stage_core.api import UsageError

ENV_VAR = "ASTRA_SIM_BIN"
PLACEHOLDER = "<ASTRA-sim analytical binary>"
# what astra-sim's build/astra_analytical/build.sh produces
CONVENTIONAL_PATH = "build/astra_analytical/build/bin/AstraSim_Analytical_Congestion_Unaware"
#: the analytical binaries' names, looked up on PATH when neither option nor variable is set
PATH_NAMES = ("AstraSim_Analytical_Congestion_Unaware", "AstraSim_Analytical_Congestion_Aware")


@dataclass(frozen=True)
class SimPaths:
    """The five files the simulator reads."""

    workload: Path
    comm_groups: Path
    system: Path
    network: Path
    memory: Path
    logging: Path | None = None  # spdlog_setup TOML (the per-node timeline log)


def find_binary(option: str | None, env: Mapping[str, str]) -> Path | None:
    """The binary from ``--astra-sim``, else ``$ASTRA_SIM_BIN``, else the first of
    :data:`PATH_NAMES` on ``env``'s PATH; None when there is none."""
    if option:
        value, origin = option, "--astra-sim"
    elif env.get(ENV_VAR):
        value, origin = env[ENV_VAR], f"${ENV_VAR}"
    else:
        search = env.get("PATH")
        for name in PATH_NAMES if search else ():
            found = shutil.which(name, path=search)
            if found:
                return Path(found).resolve()
        return None
    path = Path(value).expanduser()
    if path.is_file() and os.access(path, os.X_OK):
        return path.resolve()
    found = shutil.which(value)
    if found:
        return Path(found).resolve()
    why = "is not executable" if path.is_file() else "not found"
    raise UsageError(f"{origin} {value} {why}: give the path of ASTRA-sim's "
                     f"analytical binary (…/{CONVENTIONAL_PATH})")


def argv(binary: str, paths: SimPaths) -> list[str]:
    """The simulator's command line."""
    return [
        binary,
        f"--workload-configuration={paths.workload}",
        f"--comm-group-configuration={paths.comm_groups}",
        f"--system-configuration={paths.system}",
        f"--network-configuration={paths.network}",
        f"--remote-memory-configuration={paths.memory}",
    ] + ([f"--logging-configuration={paths.logging}"] if paths.logging else [])


def command_line(paths: SimPaths, binary: Path | None = None) -> str:
    """A shell line; without a binary the first word is :data:`PLACEHOLDER`."""
    words = argv(str(binary) if binary else PLACEHOLDER, paths)
    quoted = [shlex.quote(w) for w in words[1:]]
    first = shlex.quote(words[0]) if binary else words[0]
    return " \\\n    ".join([first] + quoted)


@dataclass(frozen=True)
class RunOutcome:
    returncode: int
    stdout_path: Path
    stderr_path: Path


def run(binary: Path, paths: SimPaths, workdir: Path) -> RunOutcome:
    """Run the simulator in ``workdir`` (its log folder lands there).

    stdout and stderr stream to ``workdir/stdout.txt`` and ``workdir/stderr.txt``
    (through temp names, renamed when the run ends), so a large output never sits in
    memory.
    """
    out_final, err_final = workdir / "stdout.txt", workdir / "stderr.txt"
    out_tmp, err_tmp = workdir / ".stdout.txt.tmp", workdir / ".stderr.txt.tmp"
    try:
        with open(out_tmp, "wb") as out, open(err_tmp, "wb") as err:
            proc = subprocess.run(argv(str(binary), paths), stdout=out, stderr=err,
                                  stdin=subprocess.DEVNULL, cwd=workdir, check=False)
    except OSError as exc:
        for tmp in (out_tmp, err_tmp):
            tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot run {binary}: {exc.strerror}") from None
    os.replace(out_tmp, out_final)
    os.replace(err_tmp, err_final)
    return RunOutcome(proc.returncode, out_final, err_final)
