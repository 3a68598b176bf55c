"""Fuzzing the command line (issue 9, point 6; grown in issue 26): arguments and output paths
drawn by Hypothesis, on the toy model and the jsonl backend.  Arguments include the
inference tasks and serve plans (``--prefill-plan``/``--decode-plan``, keys repeated too),
``--ranks`` and ``--stage-layers``; output files go through the one output rule
(``stage_core.output.write_output``) at every kind of path a user's folder holds.

Whatever is drawn: never a traceback; exit status 0, or 1 or 2 with one line; nothing
half-written left; the user's files intact (no foreign path replaced).  The CI profile runs a fixed budget of
derandomized examples; ``HYPOTHESIS_PROFILE=long`` runs ten times more, at random.
Counts per category are printed at the end of the module (``-s`` or the summary).
"""

from __future__ import annotations

import os
import shutil
import string
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


from stage_core.cli import main
from stage_core.errors import StageError
from stage_core.output import stage_mark, write_output
from stage_core.testing import fresh_host, jsonl_plugin, reference_strategies, toy_plugin

from conftest import DP

COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
              database=None)
settings.register_profile("ci", max_examples=60, derandomize=True, **COMMON)
settings.register_profile("long", max_examples=600, **COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
STATS: Counter = Counter()


HOST = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"))
#: with the reference pp strategy too: --pp, --stage-layers, schedules
HOST_PP = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "reference"))


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    yield
    line = f"fuzz ({PROFILE} profile): " + ", ".join(f"{k}: {v}" for k, v in sorted(STATS.items()))
    request.config.fuzz_counts = [*getattr(request.config, "fuzz_counts", []), line]  # conftest prints them


def run(argv, capsys, host=HOST):
    status = main(argv, host=host)  # an exception here fails the test: a traceback
    out = capsys.readouterr()
    return status, out.err


def check_one_line(status, err):
    assert status in (0, 1, 2), status
    assert "Traceback" not in err
    if status:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("stage: "), err


def snapshot(folder):
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                out[rel] = open(path, "rb").read()
            else:
                out[rel] = None
    return out


# --------------------------------------------------------------------------- arguments

INTS = st.one_of(st.integers(-3, 12), st.sampled_from([0, 64, 10**9, 2**31, 2**63, 10**30]))
VALUES = st.one_of(INTS.map(str), st.text(string.printable, max_size=8),
                   st.sampled_from(["", "none", "full", "selective", "fp8", "bf16", "fp16", "fp32", "gpipe",
                                    "interleaved", "1f1b", "auto", "1e30", "inf", "nan", "-0", "tp-cp-ep-dp-pp",
                                    "dp-tp", "jsonl", "chakra"]))
FLAGS = ["--dp", "--tp", "--pp", "--cp", "--ep", "--zero", "--recompute", "--schedule", "--virtual-stages",
         "--grad-dtype", "--optimizer-dtype", "--seq-len", "--micro-batch-size", "--micro-batches",
         "--global-batch", "--order", "--model", "--max-nodes", "--stage-layers", "--format", "--bogus",
         "--task", "--context-len", "--decode-steps", "--prefill-ranks", "--decode-ranks", "--prefill-plan",
         "--decode-plan", "--ranks", "--moe-capacity-factor", "--plan"]
SIDE_PLANS = ["tp=1", "dp=2", "pp=2", "micro-batches=2", "dp=1,dp=2", "tp=2,tp=2", "pp=0", "cp=2", "bogus=1",
              "micro-batch-size=nan", "", ",", "tp", "tp=", "=2", "dp=1000000000"]
SET_KEYS = ["layers", "hidden", "heads", "ffn", "vocab", "seq_len", "dtype", "name", "nope", ""]


#: values that make sense for a flag, drawn two times in three so that plans also succeed
SENSIBLE = {"--dp": ["1", "2", "4"], "--tp": ["1", "2"], "--pp": ["1"], "--cp": ["1"], "--ep": ["1"],
            "--zero": ["0", "1", "2", "3"], "--recompute": ["none", "selective", "full"],
            "--schedule": ["1f1b", "gpipe"], "--virtual-stages": ["1"], "--grad-dtype": ["bf16", "fp16", "fp32"],
            "--optimizer-dtype": ["fp32", "bf16"], "--seq-len": ["8", "16", "32"], "--micro-batch-size": ["1", "2"],
            "--micro-batches": ["1", "3", "100000"], "--global-batch": ["4", "8"], "--order": ["tp-cp-ep-dp-pp"],
            "--model": ["toy"], "--max-nodes": ["100", "1000000"], "--format": ["jsonl"],
            "--task": ["train", "prefill", "decode", "serve"], "--context-len": ["8", "16"],
            "--decode-steps": ["1", "2"], "--prefill-ranks": ["1", "2", "1000000"], "--decode-ranks": ["1", "2"],
            "--prefill-plan": SIDE_PLANS, "--decode-plan": SIDE_PLANS,
            "--ranks": ["0", "0-1", "1,0", "0,0", "5", "-1", "0-", "1-0", "0,2-3"],
            "--stage-layers": ["auto", "1,1", "2,0", "1", "auto,1", "0,2", "1,1,1,1"],
            "--moe-capacity-factor": ["1.25", "inf", "nan", "0", "-1"], "--plan": ["", "nope"]}


@st.composite
def arguments(draw):
    argv = [draw(st.sampled_from(["report", "generate"]))]
    argv += ["--model", draw(st.sampled_from(["toy"] * 6 + ["", "nope", "config.json"]))]
    for flag in draw(st.lists(st.sampled_from(FLAGS), max_size=4, unique=True)):
        sensible = st.sampled_from(SENSIBLE.get(flag, ["1"]))
        argv += [flag, draw(st.one_of(sensible, sensible, VALUES))]
    for _ in range(draw(st.integers(0, 2))):
        value = draw(st.one_of(st.sampled_from(["1", "2", "4", "64"]), VALUES))
        argv += ["--set", f"{draw(st.sampled_from(SET_KEYS))}={value}"]
    if draw(st.booleans()):
        argv.append(draw(st.sampled_from(["--sp", "--no-sp", "--json", "--json", "--quiet", "-o"])))
    return argv


@settings(settings.get_profile(PROFILE))
@given(argv=arguments(), with_pp=st.booleans())
def test_any_arguments(argv, with_pp, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("args")
    os.chdir(folder)  # a relative -o lands here
    try:
        if argv[0] == "generate" and "--format" not in argv:
            argv += ["--format", "jsonl"]
        status, err = run(argv, capsys, HOST_PP if with_pp else HOST)
        check_one_line(status, err)
        left = sorted(os.listdir(folder))
        # written whole, or nothing: no temporary folder, no part of a set
        assert left in ([], ["traces"]) or (status == 0 and len(left) == 1), left
        if left == ["traces"]:
            assert status == 0 and "manifest.json" in os.listdir(folder / "traces")
        STATS[f"arguments exit {status}"] += 1
    finally:
        os.chdir(tmp_path_factory.getbasetemp())
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- output paths

NAMES = st.one_of(
    st.sampled_from(["", ".", "..", "out", "out/", "./out", "a/b/out", "mine", "mine/x", "file.txt",
                     "file.txt/x", "link", "dangling", "loop/x", "set", "set/", "empty", "~", "-o", " ",
                     "a" * 255, "a" * 256, "é" * 128, "nl\nname", "../out", "mine/.."]),
    st.text(string.ascii_letters + string.digits + "./_- é\n", min_size=1, max_size=12),
)


def garden(folder):
    """A user's folder: files of theirs, a STAGE set, links, an empty folder."""
    (folder / "mine" / "sub").mkdir(parents=True)
    (folder / "mine" / "thesis.txt").write_text("years of work")
    (folder / "mine" / "sub" / "data.csv").write_text("1,2,3")
    (folder / "file.txt").write_text("a file")
    (folder / "empty").mkdir()
    (folder / "link").symlink_to(folder / "mine")
    (folder / "dangling").symlink_to(folder / "nowhere" / "x")
    (folder / "loop").symlink_to(folder / "loop")


@pytest.fixture(scope="module")
def a_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("one-set") / "set"
    assert main(["generate", "--model", "toy", "--dp", "2", "--format", "jsonl", "-o", str(out)], host=HOST) == 0
    return out


@settings(settings.get_profile(PROFILE))
@given(name=NAMES, inside=st.sampled_from(["", "mine", "mine/sub", "empty"]))
def test_any_output_path(name, inside, a_set, tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("paths")
    garden(root)
    shutil.copytree(a_set, root / "set")
    here = root / inside
    os.chdir(here)
    try:
        before = snapshot(root)
        status, err = run(["generate", "--model", "toy", "--dp", "2", "--format", "jsonl", "-o", name], capsys)
        check_one_line(status, err)
        after = snapshot(root)
        if status:
            assert after == before  # refused: untouched, nothing half-written
            STATS["paths refused"] += 1
            return
        target = os.path.realpath(os.path.join(here, name))  # (no ~ expansion: that is the shell's)
        set_files = ["comm_groups.json", "manifest.json", "trace.0.jsonl", "trace.1.jsonl"]
        if not target.startswith(str(root) + os.sep):  # written beside the garden (../out)
            assert sorted(os.listdir(target)) == set_files and after == before
            shutil.rmtree(target)
            STATS["paths written"] += 1
            return
        rel = os.path.relpath(target, root)
        written = {k for k in after if k == rel or k.startswith(rel + os.sep)}
        assert sorted(os.path.relpath(os.path.join(root, k), target) for k in written if k != rel) == set_files
        # everything else is as it was, but for a replaced set or empty folder and new parents
        for key, value in before.items():
            if key in written or (rel.startswith(key + os.sep) and value is None):
                continue
            assert after.get(key) == value, key  # a user's file, unchanged
        replaced = [k for k in before if k in written and k != rel]
        assert all(k.startswith(("set" + os.sep, "set")) for k in replaced), replaced
        STATS["paths written"] += 1
    finally:
        os.chdir(tmp_path_factory.getbasetemp())
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- output files (issue 26)

_GARDEN_NAMES = st.sampled_from(["new.json", "t.json", "mine/thesis.txt", "mine/sub/data.csv", "file.txt", "link", "dangling",
                     "loop", "loop/x.json", "fifo", "sock", "empty", "empty/", "set/trace.0.jsonl", "set/new.json",
                     "set/sub/x.json", "stage.json", "stage.png", "mine", "", ".", "..", "/dev/null", "/dev/zero",
                     "input.json", "inputs/x.json", "file.txt/x.json", "a/b/new.json", "x" * 256 + ".json",
                     "é.json", "nl\nname.json"])
FILE_NAMES = st.one_of(_GARDEN_NAMES, _GARDEN_NAMES, _GARDEN_NAMES, st.text(string.ascii_letters + string.digits + "./_- é\n", min_size=1, max_size=12))
#: the files write_output may replace in the garden: those STAGE wrote (its mark first)
STAGES = {"stage.json"}


def output_garden(folder):
    """A user's folder for single files: theirs, STAGE's, a set, a FIFO, a socket, links, inputs."""
    garden(folder)
    os.mkfifo(folder / "fifo")
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "sock"))
    (folder / "stage.json").write_text(__import__("json").dumps(stage_mark()) + "\n")
    (folder / "stage.png").write_bytes(b"\x89PNG\r\n\x1a\n not ours")
    (folder / "input.json").write_text('{"a profile": 1}')
    (folder / "inputs").mkdir()
    return sock


@settings(settings.get_profile(PROFILE))
@given(name=FILE_NAMES, force=st.booleans(), inside=st.sampled_from(["", "", "", "", "mine", "empty"]))
def test_any_output_file(name, force, inside, a_set, tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    sock = output_garden(root)
    shutil.copytree(a_set, root / "set")
    here = root / inside
    os.chdir(here)
    try:
        before = snapshot(root)
        content = '{"stage_version": "0", "new": true}\n'
        try:
            write_output(name, content, "--timeline", inputs=[root / "input.json", root / "inputs"], force=force)
            status = 0
        except StageError as exc:
            status = exc.exit_status
            assert "\n" not in str(exc).strip() or "\n" in name, str(exc)  # (the CLI escapes a name's)
        after = snapshot(root)
        target = os.path.realpath(os.path.join(here, name)) if name else ""
        rel = os.path.relpath(target, root) if target.startswith(str(root) + os.sep) else None
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        if status:
            assert after == before, changed  # refused: nothing written, no temporary file
            STATS["files refused"] += 1
            return
        if rel is None:  # written outside the garden (../x)
            assert after == before
            os.unlink(target)
            STATS["files written"] += 1
            return
        made_parents = {k for k in changed if k not in before and rel.startswith(k + os.sep)}
        assert changed - made_parents == {rel}, changed  # only the target, and new parent folders
        assert after[rel] == content.encode()
        replaced = rel in before
        foreign = replaced and rel not in STAGES
        assert not foreign or force, rel  # a user's file only with --force
        assert not rel.startswith("set" + os.sep) and rel != "input.json" and not rel.startswith("inputs")
        STATS["files replaced (foreign, with --force)" if foreign else
              "files replaced (STAGE's)" if replaced else "files written"] += 1
        STATS["foreign files replaced without --force"] += 0
    finally:
        sock.close()
        os.chdir(tmp_path_factory.getbasetemp())
        shutil.rmtree(root, ignore_errors=True)
