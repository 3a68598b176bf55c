"""The command line on the core alone: the toy model, the jsonl backend, a dp strategy
of the tests' own (conftest.DP), declared as any plugin would."""

import json
import os

import pytest

from stage_core import hookimpl
from stage_core.cli import main
from stage_core.records import BackendSpec
from stage_core.testing import fresh_host, jsonl_plugin, read_jsonl, toy_plugin, write_jsonl

from conftest import DP


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"))


def run(host, capsys, *argv):
    status = main(list(argv), host=host)
    out = capsys.readouterr()
    return status, out.out, out.err


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir())


def test_generate_writes_a_valid_set_and_a_manifest(host, capsys, tmp_path):
    out = tmp_path / "out"
    status, stdout, err = run(host, capsys, "generate", "--model", "toy", "--dp", "4", "--format", "jsonl",
                              "-o", str(out))
    assert status == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["comm_groups.json", "manifest.json"] + [f"trace.{r}.jsonl" for r in range(4)]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["units"] == {"compute": "FLOPs", "sizes": "bytes"}
    assert manifest["world_size"] == 4 and manifest["plan"]["dp"] == 4
    groups = json.loads((out / "comm_groups.json").read_text())
    assert groups == {"1": [0, 1, 2, 3]}
    assert main(["validate", str(out)], host=host) == 0
    assert leftovers(tmp_path) == ["out"]


def one_line_error(status, err, *needles):
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("argv,needles", [
    (["--model", "no-such-model"], ["no-such-model", "unknown model", "toy"]),
    (["--model", "toy", "--dp", "0"], ["--dp 0", "positive"]),
    (["--model", "toy", "--tp", "-1"], ["--tp -1", "positive"]),
    (["--model", "toy", "--dp", "4", "--global-batch", "10"], ["--dp 4", "global batch 10", "valid --dp: 1, 2, 5, 10"]),
    (["--model", "toy", "--dp", "x"], ["--dp", "invalid int value"]),
    (["--model", "toy", "--recompute", "some"], ["--recompute some", "none, selective, full"]),
    (["--model", "toy", "--set", "layers"], ["--set layers", "KEY=VALUE"]),
    (["--model", "toy", "--set", "nope=1"], ["nope", "valid fields"]),
    (["--model", "toy", "--format", "xml"], ["--format xml", "jsonl"]),
    (["--model", "toy", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["--model", "toy", "--stage-layers", "2,x"], ["--stage-layers 2,x", "auto or one layer count per stage"]),
    (["--model", "toy", "--stage-layers", "2"], ["--stage-layers 2", "needs --pp above 1"]),
    (["--model", "toy", "--dp", "4", "--ep", "3"], ["--ep 3", "carved out of dp*cp = 4", "valid: 1, 2, 4"]),
    (["--model", "toy", "--dp", "2", "--etp", "0"], ["--etp 0", "positive"]),
    (["--model", "toy", "--tp", "2", "--dp", "2", "--ep", "2", "--etp", "4"], ["--ep 2 with --etp 4",
                                                                                  "valid --ep: 1"]),
    (["--model", "toy", "--moe-imbalance", "0.5"], ["--moe-imbalance 0.5", "1 or more"]),
    (["--model", "toy", "--moe-capacity-factor", "0"], ["--moe-capacity-factor 0.0", "positive finite number"]),
    (["--model", "toy", "--moe-dispatcher", "ring"], ["--moe-dispatcher ring", "alltoall, allgather"]),
])
def test_bad_input_is_one_line_exit_2_and_no_output(host, capsys, tmp_path, argv, needles):
    out = tmp_path / "out"
    fmt = [] if "--format" in argv else ["--format", "jsonl"]
    status, _, err = run(host, capsys, "generate", *argv, *fmt, "-o", str(out))
    one_line_error(status, err, *needles)
    assert leftovers(tmp_path) == []


def test_unwritable_output_folder(host, capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    status, _, err = run(host, capsys, "generate", "--model", "toy", "--format", "jsonl", "-o", str(blocker / "out"))
    one_line_error(status, err, str(blocker), "not a folder")
    assert leftovers(tmp_path) == ["a-file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only folders")
def test_read_only_output_folder(host, capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        status, _, err = run(host, capsys, "generate", "--model", "toy", "--format", "jsonl", "-o", str(locked / "out"))
        one_line_error(status, err, "permission denied")
        assert leftovers(locked) == []
    finally:
        locked.chmod(0o700)


def test_a_set_that_fails_validation_is_never_moved_into_place(capsys, tmp_path):
    def write_broken(job, out_dir):
        write_jsonl(job, out_dir)
        path = out_dir / "trace.0.jsonl"
        lines = path.read_text().splitlines()
        path.write_text("\n".join(lines + [lines[-1]]) + "\n")  # a duplicate node id on rank 0

    class Broken:
        @hookimpl
        def stage_trace_backends(self):
            return [BackendSpec("broken", write_broken, read_jsonl, lambda d: True)]

    host = fresh_host((toy_plugin, "toy"), (Broken(), "broken"), (DP(), "dp"))
    out = tmp_path / "out"
    status, _, err = run(host, capsys, "generate", "--model", "toy", "--dp", "2", "--format", "broken", "-o", str(out))
    assert status == 1
    assert "rank 0" in err and "duplicate" in err
    assert leftovers(tmp_path) == []


def test_a_second_run_replaces_the_set_whole(host, capsys, tmp_path):
    out = tmp_path / "out"
    assert run(host, capsys, "generate", "--model", "toy", "--dp", "4", "--format", "jsonl", "-o", str(out))[0] == 0
    assert run(host, capsys, "generate", "--model", "toy", "--dp", "2", "--format", "jsonl", "-o", str(out))[0] == 0
    assert sorted(p.name for p in out.glob("trace.*")) == ["trace.0.jsonl", "trace.1.jsonl"]
    assert leftovers(tmp_path) == ["out"]


def test_report_json_has_the_manifest_keys(host, capsys):
    status, stdout, _ = run(host, capsys, "report", "--model", "toy", "--dp", "2", "--json")
    assert status == 0
    data = json.loads(stdout)
    rc = data["rank_classes"][0]
    assert set(rc) == {"ranks", "flops", "memory_bytes", "comm_bytes", "wire_bytes", "kernel_bytes", "nodes"}
    assert set(rc["memory_bytes"]) == {"parameters", "gradients", "optimizer", "activations", "total"}
    assert set(rc["comm_bytes"]) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv"}
    assert rc["flops"]["total"] == rc["flops"]["matmul"] + rc["flops"]["other"]


def test_set_overrides_a_preset_field(host, capsys):
    status, stdout, _ = run(host, capsys, "report", "--model", "toy", "--set", "layers=5", "--json")
    assert status == 0 and json.loads(stdout)["model"]["layers"] == 5


# --------------------------------------------------------------------------- subsets and progress


def test_generate_a_subset_of_ranks(host, capsys, tmp_path):
    out = tmp_path / "part"
    status, stdout, err = run(host, capsys, "generate", "--model", "toy", "--dp", "4", "--format", "jsonl",
                              "--ranks", "3,1", "-o", str(out))
    assert status == 0, err
    assert "wrote 2 of 4 traces (ranks 1,3)" in stdout
    assert leftovers(out) == ["comm_groups.json", "manifest.json", "trace.1.jsonl", "trace.3.jsonl"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["subset"] == {"ranks": "1,3", "count": 2} and manifest["world_size"] == 4
    status, stdout, _ = run(host, capsys, "validate", str(out))
    assert status == 0 and stdout.strip() == f"{out}: 2 of 4 ranks (1,3), valid"
    status, _, err = run(host, capsys, "generate", "--model", "toy", "--dp", "4", "--format", "jsonl",
                         "--ranks", "2-4", "-o", str(tmp_path / "bad"))
    assert status == 2 and err.strip() == "stage: error: --ranks 2-4: rank 4 is outside the world (ranks 0-3)"
    assert not (tmp_path / "bad").exists()


def test_progress_per_phase_and_quiet(host, capsys, tmp_path, monkeypatch):
    import contextlib

    import stage_core.cli as cli
    from stage_core.progress import Progress

    calls = []

    class Recorded(Progress):
        @contextlib.contextmanager
        def phase(self, label, total=None, unit=""):
            done = []
            yield lambda n=1: done.append(n)
            calls.append((label, total, sum(done)))

    monkeypatch.setattr(cli, "progress_of", lambda args: Recorded("off" if args.quiet else "lines"))
    argv = ["generate", "--model", "toy", "--dp", "4", "--format", "jsonl"]
    assert run(host, capsys, *argv, "-o", str(tmp_path / "a"))[0] == 0
    assert calls == [("planning", None, 0), ("writing", 4, 4), ("validating", 4, 4)]
    calls.clear()
    assert run(host, capsys, "validate", str(tmp_path / "a"))[0] == 0
    assert calls == [("validating", 4, 4)]
    calls.clear()
    assert run(host, capsys, *argv, "--quiet", "-o", str(tmp_path / "b"))[0] == 0
    assert calls == [("planning", None, 0), ("writing", 4, 4), ("validating", 4, 4)]  # (shown by nothing)


class _Terminal(__import__("io").StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream,shown", [(_Terminal(), True), (__import__("io").StringIO(), False)])
def test_progress_bar_draws_on_a_terminal_only(monkeypatch, stream, shown):
    from stage_core.progress import Progress

    monkeypatch.delenv("STAGE_PROGRESS", raising=False)
    progress = Progress(stream=stream, delay=0)
    assert progress.mode == ("bar" if shown else "lines")
    with progress.phase("writing", 10, "ranks") as update:
        update(4)
        update(6)
    assert ("writing:" in stream.getvalue() and "/10 [" in stream.getvalue()) == shown
    if not shown:  # a log gets plain lines: the phase's end, with its count and time
        assert stream.getvalue().splitlines()[-1].startswith("stage: writing: 10 of 10 ranks (100%) in ")


def test_progress_in_a_log_is_plain_lines_for_long_phases_only():
    import io
    import time

    from stage_core.progress import Progress

    log = io.StringIO()
    quick = Progress("lines", stream=log, delay=0.2, interval=0.05)
    with quick.phase("planning") as done:
        done(1)
    assert log.getvalue() == ""  # a phase shorter than the delay says nothing
    with quick.phase("simulating", 3, "ranks") as done:
        time.sleep(0.25)
        done(1)  # past the delay: a line
        time.sleep(0.06)
        done(1)  # past the interval: another
        done(1)  # (the whole count: the end line says it)
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("stage: simulating: 1 of 3 ranks (33%), ") and lines[0].endswith(" s")
    assert lines[1].startswith("stage: simulating: 2 of 3 ranks (67%), ")
    assert lines[2].startswith("stage: simulating: 3 of 3 ranks (100%) in ") and len(lines) == 3
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()  # no bar drawing in a log
    off = io.StringIO()
    with Progress("off", stream=off, delay=0).phase("writing", 2) as done:
        time.sleep(0.01)
        done(2)
    assert off.getvalue() == ""


def test_a_bar_without_a_count_shows_the_elapsed_time():
    import time

    from stage_core.progress import Progress

    term = _Terminal()
    with Progress("bar", stream=term, delay=0).phase("planning"):
        time.sleep(1.2)  # redrawn every 0.5 s by its own thread
    text = term.getvalue()
    assert "planning: 00:01" in text, text


def test_comm_groups_json_holds_one_group_a_line(host, capsys, tmp_path):
    out = tmp_path / "set"
    assert run(host, capsys, "generate", "--model", "toy", "--dp", "4", "--format", "jsonl", "-o", str(out))[0] == 0
    text = (out / "comm_groups.json").read_text()
    groups = json.loads(text)
    assert text.splitlines() == ["{", *[f'"{k}": {json.dumps(v)}' + ("," if i < len(groups) - 1 else "")
                                        for i, (k, v) in enumerate(groups.items())], "}"]
    assert groups == {"1": [0, 1, 2, 3]}  # the toy model on dp 4: one data-parallel group
