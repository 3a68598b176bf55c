"""`stage astrasim` on a read-only or full disk (issue 26): one line, and the set's astrasim
folder is whole or absent (it was left half-written, after a traceback).  Real tmpfs file
systems of a few pages, mounted in a user namespace (skipped where that is not allowed)."""

import shutil
import subprocess
import sys

import pytest
from conftest import ASTRA_SIM, NO_SIMULATOR


def _tmpfs_works():
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                          capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _tmpfs_works(), reason="cannot mount a tmpfs in a user namespace (unshare -rm)")


def on_small_disk(run_stage, tmp_path, options: str, then: str):
    """Copy a 2-rank set onto a tmpfs mounted with ``options``, run the shell ``then`` there."""
    source = tmp_path / "source"
    assert run_stage("generate", "--model", "gpt-tiny", "--dp", "2", "-q", "-o", source).returncode == 0
    disk = tmp_path / "disk"
    disk.mkdir()
    stage = shutil.which("stage") or str(__import__("pathlib").Path(sys.executable).parent / "stage")
    script = (f'mount -t tmpfs -o {options} tmpfs "{disk}" && cp -r "{source}" "{disk}/set" && {then}; '
              f'{stage} astrasim "{disk}/set" > /dev/null; echo "status=$?"; '
              f'ls -A "{disk}/set"; ls -A "{disk}/set/astrasim" 2>/dev/null | sed "s/^/astrasim\\//"')
    env = {"ASTRA_SIM_BIN": ASTRA_SIM or "", "PATH": "/usr/bin:/bin"}
    run = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env)
    status = int(run.stdout.split("status=")[1].split()[0])
    left = run.stdout.split("status=")[1].split()[1:]
    return status, run.stderr, left


def test_a_read_only_disk_is_one_line_and_nothing_is_written(run_stage, tmp_path):
    status, err, left = on_small_disk(run_stage, tmp_path, "size=400k", f'mount -o remount,ro "{tmp_path}/disk"')
    assert status == 2 and err.count("\n") == 1 and "Read-only file system" in err, err
    assert left == ["comm_groups.json", "manifest.json", "trace.0.et", "trace.1.et"]


@pytest.mark.parametrize("kib", [28, 36, 44, 120, 400])
def test_a_full_disk_leaves_the_folder_whole_or_absent(run_stage, tmp_path, kib):
    # the set takes 24 KiB; then the configs (28, 36: they do not fit), the simulator's log
    # and output, results.json (44, 120: it does not fit) and all of it (400)
    if not ASTRA_SIM:
        pytest.skip(NO_SIMULATOR)
    status, err, left = on_small_disk(run_stage, tmp_path, f"size={kib}k", "true")
    set_files = ["comm_groups.json", "manifest.json", "trace.0.et", "trace.1.et"]
    if status == 0:
        assert "astrasim/results.json" in left and "astrasim/system.json" in left
    else:
        errors = [line for line in err.splitlines() if line.startswith("stage: ")]
        assert status == 1 and len(errors) == 1 and "No space left on device" in errors[0], err
        assert "Traceback" not in err and left == set_files, left  # no half-written astrasim folder
