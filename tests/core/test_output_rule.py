"""One output rule for every file STAGE writes (issue 26): stage_core.output.write_output,
crash-only cleanup of what a killed writer left, workers that die with their parent, and
inputs read bounded (stage_core.inputs)."""

import errno
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stage_core import output
from stage_core.cli import main
from stage_core.errors import OutputError, UsageError
from stage_core.inputs import read_json
from stage_core.output import recognized, remove_stale, stage_mark, write_output
from stage_core.testing import fresh_host, jsonl_plugin, toy_plugin

from conftest import DP


def snapshot(folder):
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            info = os.lstat(path)
            out[rel] = (stat.S_IFMT(info.st_mode), open(path, "rb").read() if stat.S_ISREG(info.st_mode) else None)
    return out


MARKED = json.dumps({**stage_mark(), "what": "a file STAGE wrote"}) + "\n"


# --------------------------------------------------------------------------- what is never replaced


@pytest.mark.parametrize("make,needle", [
    (lambda p: os.mkfifo(p), "is a FIFO"),
    (lambda p: p.mkdir(), "is a folder"),
    (lambda p: p.symlink_to(p.parent / "theirs.json"), r"is a symbolic link \(to "),
    (lambda p: socket.socket(socket.AF_UNIX).bind(str(p)), "is a socket"),
])
def test_a_non_regular_file_is_never_replaced_even_with_force(tmp_path, make, needle):
    (tmp_path / "theirs.json").write_text("the user's")
    target = tmp_path / "out.json"
    make(target)
    before = snapshot(tmp_path)
    for force in (False, True):
        with pytest.raises(UsageError, match=needle):
            write_output(target, MARKED, "--timeline", force=force)
        assert snapshot(tmp_path) == before  # and no temporary file left


def test_a_device_is_never_replaced(tmp_path):
    # as root, `--timeline /dev/null` used to replace /dev/null with a regular file
    with pytest.raises(UsageError, match="--timeline /dev/null: is a character device"):
        write_output("/dev/null", MARKED, "--timeline", force=True)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_file_inside_a_trace_set_is_refused(tmp_path):
    host = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"))
    assert main(["generate", "--model", "toy", "--format", "jsonl", "-o", str(tmp_path / "set"), "-q"], host=host) == 0
    before = snapshot(tmp_path)
    for name in ("trace.0.jsonl", "new.json", "sub/new.json"):
        with pytest.raises(UsageError, match=f"is inside the trace set {tmp_path / 'set'}"):
            write_output(tmp_path / "set" / name, MARKED, "--timeline", force=True)
    assert snapshot(tmp_path) == before
    # a foreign set (a comm_groups.json beside the traces, no manifest) too
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "comm_groups.json").write_text("{}")
    with pytest.raises(UsageError, match="is inside the trace set"):
        write_output(tmp_path / "other" / "t.json", MARKED, "--timeline")


def test_an_input_of_the_command_is_refused_even_with_force(tmp_path):
    # `stage calibrate -o X X` overwrote the profile it read
    profile = tmp_path / "profile.json"
    profile.write_text(MARKED)  # (even one STAGE wrote)
    for given in (profile, tmp_path / "." / "profile.json"):
        with pytest.raises(UsageError, match="which this command reads"):
            write_output(given, "{}", "-o", inputs=[profile], force=True)
    (tmp_path / "link.json").symlink_to(profile)
    with pytest.raises(UsageError, match="is a symbolic link"):
        write_output(tmp_path / "link.json", "{}", "-o", inputs=[profile], force=True)
    (tmp_path / "inputs").mkdir()
    with pytest.raises(UsageError, match="is inside .*inputs, which this command reads"):
        write_output(tmp_path / "inputs" / "x.json", "{}", "-o", inputs=[tmp_path / "inputs"])
    assert profile.read_text() == MARKED


def test_a_users_file_needs_force_and_a_file_stage_wrote_does_not(tmp_path):
    target = tmp_path / "sweep.json"
    target.write_text("[1, 2, 3]  my table\n")
    with pytest.raises(UsageError, match="exists and STAGE did not write it; give another name, or --force"):
        write_output(target, MARKED, "-o")
    assert target.read_text() == "[1, 2, 3]  my table\n"
    write_output(target, MARKED, "-o", force=True)
    assert target.read_text() == MARKED and recognized(target)
    write_output(target, MARKED.replace("a file", "the file"), "-o")  # STAGE's: replaced without --force
    assert "the file STAGE wrote" in target.read_text()
    assert os.listdir(tmp_path) == ["sweep.json"]


def test_the_marks_stage_recognizes(tmp_path):
    cases = {
        "a.json": (MARKED, True),
        "b.json": ('{"otherData": {"stage_version": "0.1.0"}, "traceEvents": []}', True),  # a timeline
        "c.json": ('{"traceEvents": [], "otherData": {"stage_version": "0.1.0"}}', False),  # (not first)
        "d.json": ('{"name": "a100-mine"}', False),
        "e.png": (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", bytes(13)) + _chunk(b"tEXt", b"Software\0stage 0.1.0"),
                  True),
        "f.png": (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", bytes(13)) + _chunk(b"tEXt", b"Software\0GIMP"), False),
        "g.csv": ("unit,status,error\n", False),  # (a sweep recognizes its own tables)
    }
    for name, (content, ours) in cases.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        assert recognized(path) is ours, name


def _chunk(kind: bytes, data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + kind + data + b"\0\0\0\0"


class _Figure:
    """What write_figure uses of a matplotlib figure: savefig(path, dpi, format, metadata)."""

    def __init__(self, fail=False):
        self.saved, self.fail = [], fail

    def savefig(self, path, *, dpi, format, metadata):
        if self.fail:
            raise OSError(errno.ENOSPC, "No space left on device")
        text = b"".join(k.encode() + b"\0" + v.encode() for k, v in metadata.items())
        Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", bytes(13)) + _chunk(b"tEXt", text))
        self.saved.append((dpi, format))


def test_a_figure_is_a_png_stage_recognizes(tmp_path):
    fig = _Figure()
    target = output.write_figure(tmp_path / "plot.png", fig)
    assert fig.saved == [(120, "png")] and recognized(target)
    output.write_figure(target, _Figure())  # STAGE's own plot: replaced without --force
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(UsageError, match="--plot .*mine.png: exists and STAGE did not write it"):
        output.write_figure(mine, _Figure())
    with pytest.raises(OutputError):
        output.write_figure(tmp_path / "full.png", _Figure(fail=True))
    assert sorted(os.listdir(tmp_path)) == ["mine.png", "plot.png"]


def test_a_failed_write_leaves_the_previous_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "deep" / "er" / "t.json"

    def full(path):
        path.write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    with pytest.raises(OutputError, match="No space left on device.*nothing was changed; free some space"):
        write_output(target, full, "--timeline")
    assert os.listdir(tmp_path) == []  # the parent folders made for it went too
    target.parent.mkdir(parents=True)
    target.write_text(MARKED)
    with pytest.raises(OutputError):
        write_output(target, full, "--timeline")
    assert os.listdir(target.parent) == ["t.json"] and target.read_text() == MARKED


def test_the_file_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        write_output(tmp_path / "t.json", MARKED, "-o")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "t.json").stat().st_mode) == 0o640


# --------------------------------------------------------------------------- crash-only cleanup


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_what_a_killed_writer_left_is_removed_by_the_next_run(tmp_path):
    dead, host = _dead_pid(), output._host_tag()
    stale = tmp_path / f".out.tmp-{dead}-{host}-abcd1234"
    (stale / "deep").mkdir(parents=True)
    (stale / "deep" / "trace.0.jsonl").write_text("x" * 1000)
    stale_file = tmp_path / f".t.json.tmp-{dead}-{host}-efgh5678.json"
    stale_file.write_text("half")
    alive = tmp_path / f".out.tmp-{os.getpid()}-{host}-live0000"  # a writer still at work: left alone
    alive.mkdir()
    elsewhere = tmp_path / f".out.tmp-{dead}-{'0000' if host != '0000' else '0001'}-other000"  # another host's
    elsewhere.mkdir()
    mine = tmp_path / ".out.tmp-notapid"  # not a name STAGE makes
    mine.mkdir()
    host_ = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"))
    assert main(["generate", "--model", "toy", "--format", "jsonl", "-o", str(tmp_path / "out"), "-q"],
                host=host_) == 0
    assert sorted(os.listdir(tmp_path)) == sorted([alive.name, elsewhere.name, mine.name, stale_file.name, "out"])
    write_output(tmp_path / "t.json", MARKED, "--timeline")
    assert sorted(os.listdir(tmp_path)) == sorted([alive.name, elsewhere.name, mine.name, "out", "t.json"])


def test_a_previous_set_a_kill_left_moved_aside_is_put_back(tmp_path):
    # killed between moving the old set aside and moving the new one in: target missing
    dead = _dead_pid()
    old = tmp_path / f".out.old-{dead}-{output._host_tag()}-abcd1234"
    (old / "set").mkdir(parents=True)
    (old / "set" / "manifest.json").write_text("{}")
    assert remove_stale(tmp_path / "out") == [old.name]
    assert os.listdir(tmp_path) == ["out"] and os.listdir(tmp_path / "out") == ["manifest.json"]


def test_a_pid_given_to_a_later_process_counts_as_gone():
    # the pid lives, but its process started after the temporary folder was last touched
    assert output.writer_gone(os.getpid(), time.time() - 3600)
    assert not output.writer_gone(os.getpid(), time.time())
    assert output.writer_gone(_dead_pid(), time.time())


_ORPHAN = """
import os, sys, time
from stage_core.output import die_with_parent
if os.fork() == 0:          # the worker
    if sys.argv[1] == "die":
        die_with_parent()
    print(os.getpid(), flush=True)
    time.sleep(30)
    os._exit(0)
time.sleep(30)              # the parent, killed by the test
"""


@pytest.mark.parametrize("mode,survives", [("die", False), ("stay", True)])
def test_a_worker_dies_with_its_parent(mode, survives):
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN, mode], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    parent.kill()  # SIGKILL: no handler runs
    parent.wait()
    deadline = time.time() + (5 if mode == "die" else 1)  # (the kernel's SIGKILL comes at once)
    while time.time() < deadline and _alive(worker):
        time.sleep(0.05)
    try:
        assert _alive(worker) is survives  # without die_with_parent the orphan goes on
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


_SLOW_WRITER = """
import sys, time
from stage_core.cli import main
from stage_core.records import BackendSpec
from stage_core.testing import fresh_host, jsonl_plugin, read_jsonl, toy_plugin, write_jsonl
from stage_core import hookimpl
import test_output_rule as t

def slow(job, folder):
    write_jsonl(job, folder)
    print("written", flush=True)
    time.sleep(60)

class Backend:
    @hookimpl
    def stage_trace_backends(self):
        return [BackendSpec("jsonl", slow, read_jsonl, lambda d: True, format_id="jsonl")]

sys.exit(main(sys.argv[1:], host=fresh_host((toy_plugin, "toy"), (Backend(), "jsonl"), (t.DP(), "dp"))))
"""


def test_sigkill_during_a_write_then_a_rerun_leaves_nothing(tmp_path):
    argv = ["generate", "--model", "toy", "--dp", "4", "--format", "jsonl", "-o", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, *argv], stdout=subprocess.PIPE, text=True, env=env)
    assert run.stdout.readline().strip() == "written"
    run.kill()
    run.wait()
    left = os.listdir(tmp_path)
    assert len(left) == 1 and left[0].startswith(f".out.tmp-{run.pid}-"), left  # what SIGKILL leaves
    host = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"))
    assert main(argv, host=host) == 0
    assert os.listdir(tmp_path) == ["out"]  # the rerun removed it


# --------------------------------------------------------------------------- inputs, bounded


def test_a_fifo_as_model_is_refused_at_once(tmp_path, capsys):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    started = time.perf_counter()
    assert main(["report", "--model", str(fifo)], host=fresh_host((toy_plugin, "toy"))) == 2
    assert "not a regular file but a FIFO" in capsys.readouterr().err
    assert time.perf_counter() - started < 10  # it used to wait for a writer forever


@pytest.mark.parametrize("data,needle", [
    (b"\xff\xfe{}", "not UTF-8 text (byte 0: invalid start byte)"),
    (b"[" * 50_000 + b"]" * 50_000, "JSON nested too deep"),
    (b'{"hidden_size": ' + b"9" * 5000 + b"}", f"a number of more than {sys.get_int_max_str_digits():,} digits"),
    (b'{"a": ', "not valid JSON"),
])
def test_config_json_that_python_cannot_take_is_one_line(tmp_path, capsys, data, needle):
    path = tmp_path / "config.json"
    path.write_bytes(data)
    assert main(["report", "--model", str(path)], host=fresh_host((toy_plugin, "toy"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_a_file_above_the_size_limit_is_refused_before_reading(tmp_path):
    path = tmp_path / "config.json"
    with open(path, "wb") as handle:
        handle.truncate(1 << 20)  # sparse: nothing is read
    with pytest.raises(UsageError, match="is 1,048,576 bytes, above the 1,000 STAGE reads"):
        read_json(path, "--model config.json", max_bytes=1000)
