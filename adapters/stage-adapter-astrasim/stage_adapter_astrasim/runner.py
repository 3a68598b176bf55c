"""Find a backend's binary, spell its command line, run it.

Flags are those of ASTRA-sim's frontends' common parser (astra-sim
``astra-sim/network_frontend/analytical/common/CmdLineParser.cc``, which the htsim
frontend uses too): ``--workload-configuration`` (trace prefix; files are
``<prefix>.<rank>.et``), ``--comm-group-configuration``, ``--system-configuration``,
``--remote-memory-configuration``, ``--network-configuration``; htsim takes its own
options last, after ``--htsim_opts`` (``HTSimMain.cc``: every word after it goes to
htsim's parser).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from stage_core.api import UsageError

from .backends import Backend

PLACEHOLDER = "<ASTRA-sim {name} binary>"


@dataclass(frozen=True)
class SimPaths:
    """The files the simulator reads."""

    workload: Path
    comm_groups: Path
    system: Path
    network: Path
    memory: Path
    logging: Path | None = None  # spdlog_setup TOML (the per-node timeline log)
    topology: Path | None = None  # htsim's fat tree


def find_binary(backend: Backend, option: str | None, env: Mapping[str, str]) -> Path | None:
    """The binary from ``--astra-sim``, else ``backend``'s variable, else the first of its
    names on ``env``'s PATH; None when there is none."""
    if option:
        value, origin = option, "--astra-sim"
    elif env.get(backend.env_var):
        value, origin = env[backend.env_var], f"${backend.env_var}"
    else:
        search = env.get("PATH")
        for name in backend.path_names if search else ():
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
    raise UsageError(f"{origin} {value} {why}: give the path of ASTRA-sim's {backend.name} binary "
                     f"(…/{backend.build_path})")


def argv(binary: str, paths: SimPaths) -> list[str]:
    """The simulator's command line."""
    words = [
        binary,
        f"--workload-configuration={paths.workload}",
        f"--comm-group-configuration={paths.comm_groups}",
        f"--system-configuration={paths.system}",
        f"--network-configuration={paths.network}",
        f"--remote-memory-configuration={paths.memory}",
    ] + ([f"--logging-configuration={paths.logging}"] if paths.logging else [])
    if paths.topology is not None:
        words += ["--htsim_opts", "-topo", str(paths.topology)]
    return words


def command_line(paths: SimPaths, binary: Path | None = None, backend: Backend | None = None) -> str:
    """A shell line; without a binary the first word is :data:`PLACEHOLDER`."""
    first_word = str(binary) if binary else PLACEHOLDER.format(name=backend.name if backend else "analytical")
    words = argv(first_word, paths)
    quoted = [shlex.quote(w) for w in words[1:]]
    first = shlex.quote(words[0]) if binary else words[0]
    return " \\\n    ".join([first] + quoted)


@dataclass(frozen=True)
class RunOutcome:
    returncode: int
    stdout_path: Path
    stderr_path: Path


#: a rank's end in the simulator's output (what a run's progress counts)
_FINISHED = re.compile(rb"sys\[\d+\] finished")
#: seconds between two looks at the simulator's output while it runs
POLL = 0.5


def run(binary: Path, paths: SimPaths, workdir: Path, scratch: bool = False,
        progress: Callable[[int], None] | None = None) -> RunOutcome:
    """Run the simulator; stdout and stderr stream to ``workdir/stdout.txt`` and
    ``workdir/stderr.txt`` (through temp names, renamed when the run ends), so a large
    output never sits in memory.

    The analytical binaries run in ``workdir`` (their ``log/`` folder lands there).
    ``scratch``: run in a fresh folder inside ``workdir``, removed afterwards; htsim
    writes ``./log/``, ``./logout.dat`` (a binary log of some 13 MB) and ``./idmap.txt``
    into its working folder.  ``progress(n)`` is told of each rank's ``finished`` line as
    the simulator prints it (the only progress it prints).
    """
    out_final, err_final = workdir / "stdout.txt", workdir / "stderr.txt"
    out_tmp, err_tmp = workdir / ".stdout.txt.tmp", workdir / ".stderr.txt.tmp"
    cwd = Path(tempfile.mkdtemp(prefix=".scratch-", dir=workdir)) if scratch else workdir
    try:
        with open(out_tmp, "wb") as out, open(err_tmp, "wb") as err:
            proc = subprocess.Popen(argv(str(binary), paths), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    cwd=cwd)
            _follow(proc, out_tmp, progress)
    except OSError as exc:
        for tmp in (out_tmp, err_tmp):
            tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot run {binary}: {exc.strerror}") from None
    finally:
        if scratch:
            shutil.rmtree(cwd, ignore_errors=True)
    os.replace(out_tmp, out_final)
    os.replace(err_tmp, err_final)
    return RunOutcome(proc.returncode, out_final, err_final)


def _follow(proc: subprocess.Popen, output: Path, progress: Callable[[int], None] | None) -> None:
    """Wait for ``proc``, telling ``progress`` of each ``finished`` line it writes to
    ``output`` meanwhile; an interruption (Ctrl-C, SIGTERM) ends the simulator too."""
    seen, tail = 0, b""
    try:
        while True:
            try:
                proc.wait(timeout=POLL)
                ended = True
            except subprocess.TimeoutExpired:
                ended = False
            if progress is not None:
                try:
                    with open(output, "rb") as handle:
                        handle.seek(seen)
                        chunk = handle.read()
                except OSError:
                    chunk = b""
                seen += len(chunk)
                text = tail + chunk
                cut = text.rfind(b"\n") + 1  # (a line not yet whole waits for the next look)
                count = len(_FINISHED.findall(text[:cut]))
                tail = text[cut:]
                if count:
                    progress(count)
            if ended:
                return
    except BaseException:
        proc.kill()
        proc.wait()
        raise
