"""-o never destroys what STAGE did not write (issue 9, point 1): every reproducer of the
issue, through the command line, with the toy model and the jsonl backend."""

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys

import pytest

from stage_core import hookimpl
from stage_core.cli import main
from stage_core.records import BackendSpec
from stage_core.testing import fresh_host, jsonl_plugin, read_jsonl, toy_plugin, write_jsonl

from conftest import DP


def host_with(write=write_jsonl):
    class Backend:
        @hookimpl
        def stage_trace_backends(self):
            return [BackendSpec("jsonl", write, read_jsonl, lambda d: True, format_id="jsonl")]

    return fresh_host((toy_plugin, "toy"), (Backend(), "jsonl"), (DP(), "dp"))


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"))


def generate(host, capsys, out, *more):
    status = main(["generate", "--model", "toy", "--dp", "2", "--format", "jsonl", *more, "-o", str(out)],
                  host=host)
    return status, capsys.readouterr().err


def snapshot(folder):
    """Every path under ``folder`` with its bytes (files) or None (folders and links)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            out[rel] = open(path, "rb").read() if os.path.isfile(path) and not os.path.islink(path) else None
    return out


def one_line(err, status, expected_status=2):
    lines = err.strip().splitlines()
    assert status == expected_status and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


SET_FILES = ["comm_groups.json", "manifest.json", "trace.0.jsonl", "trace.1.jsonl"]


def test_a_folder_of_the_users_is_refused_untouched_and_listed(host, capsys, tmp_path):
    # the reproducer: mkdir -p mydata/sub; echo x > mydata/thesis.txt; stage generate -o mydata
    mydata = tmp_path / "mydata"
    (mydata / "sub").mkdir(parents=True)
    (mydata / "thesis.txt").write_text("x\n")
    before = snapshot(tmp_path)
    status, err = generate(host, capsys, mydata)
    line = one_line(err, status)
    assert "not a STAGE trace set" in line and "sub/, thesis.txt" in line
    assert snapshot(tmp_path) == before


def test_a_set_with_anything_else_in_it_is_refused_naming_the_extra(host, capsys, tmp_path):
    out = tmp_path / "out"
    assert generate(host, capsys, out)[0] == 0
    (out / "notes.md").write_text("mine")
    (out / "trace.7.jsonl").write_text("{}")  # a rank the manifest's world (2) does not have
    before = snapshot(tmp_path)
    status, err = generate(host, capsys, out, "--dp", "4")
    line = one_line(err, status)
    assert "STAGE did not write (notes.md, trace.7.jsonl)" in line
    assert snapshot(tmp_path) == before


def test_a_manifest_that_is_not_stages_does_not_make_a_set(host, capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"name": "my package"}))
    (out / "trace.0.jsonl").write_text("mine")
    before = snapshot(tmp_path)
    status, err = generate(host, capsys, out)
    assert "manifest.json, trace.0.jsonl" in one_line(err, status)
    assert snapshot(tmp_path) == before


def test_a_set_or_an_empty_folder_is_replaced_whole(host, capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert generate(host, capsys, out, "--dp", "4")[0] == 0  # empty: replaced
    assert generate(host, capsys, out)[0] == 0  # a set of 4 ranks: replaced by one of 2
    assert sorted(os.listdir(out)) == SET_FILES
    assert sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize("where,given,needle", [
    ("out", ".", "is the folder you are in"),
    ("out", "../out", "is the folder you are in"),
    ("out", "..", "holds the folder you are in"),
    ("out/deeper", "../..", "holds the folder you are in"),
    ("out", "", "empty folder name"),
    ("out", "   ", "empty folder name"),
])
def test_the_folder_you_stand_in_and_empty_names_are_refused(host, capsys, tmp_path, monkeypatch,
                                                             where, given, needle):
    # the second reproducer: from inside a folder, stage generate -o ../work
    here = tmp_path / where
    here.mkdir(parents=True)
    (here / "keep.txt").write_text("y")
    monkeypatch.chdir(here)
    before = snapshot(tmp_path)
    status = main(["generate", "--model", "toy", "--format", "jsonl", "-o", given], host=host)
    line = one_line(capsys.readouterr().err, status)
    assert needle in line and line.startswith(f"stage: error: -o {given or repr('')}:")
    assert snapshot(tmp_path) == before


def test_an_empty_current_folder_is_refused_too(host, capsys, tmp_path, monkeypatch):
    # replacing the folder a shell stands in would leave the shell in a deleted folder
    monkeypatch.chdir(tmp_path)
    status = main(["generate", "--model", "toy", "--format", "jsonl", "-o", "."], host=host)
    assert "is the folder you are in" in one_line(capsys.readouterr().err, status)
    assert os.listdir(tmp_path) == []


def test_links(host, capsys, tmp_path):
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    status, err = generate(host, capsys, dangling)
    assert "symbolic link to" in one_line(err, status) and "does not exist" in err
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    status, err = generate(host, capsys, loop / "x")
    one_line(err, status)
    # a link to a set: the set it points to is replaced, the link stays
    real = tmp_path / "real"
    assert generate(host, capsys, real, "--dp", "4")[0] == 0
    link = tmp_path / "link"
    link.symlink_to(real)
    assert generate(host, capsys, link)[0] == 0
    assert link.is_symlink() and sorted(os.listdir(real)) == SET_FILES
    assert sorted(os.listdir(tmp_path)) == ["dangling", "link", "loop", "real"]


def test_names_up_to_the_file_name_limit_work_and_longer_ones_are_refused(host, capsys, tmp_path):
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    longest = tmp_path / ("n" * limit)  # the temporary name beside it must fit too
    assert generate(host, capsys, longest)[0] == 0
    assert sorted(os.listdir(longest)) == SET_FILES
    status, err = generate(host, capsys, tmp_path / ("n" * (limit + 1)))
    assert f"is {limit + 1} bytes long; this file system allows at most {limit}" in one_line(err, status)
    assert os.listdir(tmp_path) == [longest.name]


def test_a_full_disk_leaves_nothing_and_keeps_the_previous_set(capsys, tmp_path):
    out = tmp_path / "out"
    assert generate(host_with(), capsys, out)[0] == 0
    before = snapshot(tmp_path)

    def write_until_full(job, folder):
        (folder / "trace.0.jsonl").write_text("x" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "trace.1.jsonl"))

    status, err = generate(host_with(write_until_full), capsys, out, "--dp", "4")
    line = one_line(err, status, expected_status=1)
    assert "No space left on device" in line and "trace.1.jsonl" in line and "nothing was changed" in line
    assert snapshot(tmp_path) == before


def _mount_tmpfs_works():
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


needs_tmpfs = pytest.mark.skipif(not _mount_tmpfs_works(),
                                 reason="cannot mount a tmpfs in a user namespace here (unshare -rm)")

_IN_NAMESPACE = """
import sys
from stage_core.cli import main
from stage_core.testing import fresh_host, jsonl_plugin, toy_plugin
sys.exit(main(sys.argv[1:], host=fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"))))
"""


@needs_tmpfs
@pytest.mark.parametrize("options,status,needle", [
    ("size=8k", 1, "No space left on device"),  # a real full disk
    ("ro,size=64k", 2, "cannot write in"),  # a read-only file system
])
def test_a_real_small_or_read_only_file_system(tmp_path, options, status, needle):
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f'mount -t tmpfs -o {options} tmpfs "{disk}" && "{sys.executable}" -c \'{_IN_NAMESPACE}\' '
              f'generate --model toy --format jsonl --set layers=8 -o "{disk}/set"; '
              f'echo "status=$?"; ls -A "{disk}"')
    run = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], run.stderr
    assert run.stdout.split() == [f"status={status}"]  # and the disk holds nothing


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into folders whatever their mode")
def test_a_read_only_folder(host, capsys, tmp_path):
    locked = tmp_path / "locked"
    assert generate(host, capsys, locked)[0] == 0
    locked.chmod(0o500)
    try:
        status, err = generate(host, capsys, locked)
        assert "permission denied" in one_line(err, status)
        assert sorted(os.listdir(locked)) == SET_FILES
    finally:
        locked.chmod(0o700)


@pytest.fixture
def ctrl_c_interrupts():
    """SIGINT raises KeyboardInterrupt, as Ctrl-C does in a terminal.  A shell without job
    control starts a background job (a CI script's ``cmd &``) with SIGINT ignored, and
    Python then leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_during_the_write_leaves_nothing_behind(capsys, tmp_path, ctrl_c_interrupts, signum):
    out = tmp_path / "out"
    assert generate(host_with(), capsys, out)[0] == 0
    before = snapshot(tmp_path)
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]

    def write_then_get_signalled(job, folder):
        for rank in range(job.world_size):
            (folder / f"trace.{rank}.jsonl").write_text("{}\n")
        os.kill(os.getpid(), signum)  # as `kill` would, halfway through the set

    status, err = generate(host_with(write_then_get_signalled), capsys, out, "--dp", "4")
    assert one_line(err, status, 128 + signum) == f"stage: interrupted ({signal.Signals(signum).name})"
    assert snapshot(tmp_path) == before
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)] == handlers  # main() restored them


def test_the_folder_follows_the_umask(host, capsys, tmp_path):
    old = os.umask(0o027)
    try:
        assert generate(host, capsys, tmp_path / "out")[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "out" / "manifest.json").stat().st_mode) == 0o640


def test_files_that_appear_during_the_write_stop_the_replacement(capsys, tmp_path):
    out = tmp_path / "out"
    assert generate(host_with(), capsys, out)[0] == 0

    def write_while_the_user_saves_a_file(job, folder):
        write_jsonl(job, folder)
        (out / "new-notes.txt").write_text("saved meanwhile")

    status, err = generate(host_with(write_while_the_user_saves_a_file), capsys, out, "--dp", "4")
    assert "new-notes.txt" in one_line(err, status)
    assert sorted(os.listdir(out)) == sorted(SET_FILES + ["new-notes.txt"])
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_parent_folders_made_for_a_failed_run_are_removed(capsys, tmp_path):
    def fail(job, folder):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    status, err = generate(host_with(fail), capsys, tmp_path / "a" / "b" / "out")
    assert "Input/output error" in one_line(err, status, 1)
    assert os.listdir(tmp_path) == []
