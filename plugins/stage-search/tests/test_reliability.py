"""stage sweep and stage search (issue 26): the table follows the core's output rule and is
checked before any work, a failing point is a row, workers never exceed the points, a grid is
counted before it is expanded, and a flag given 0 is refused instead of defaulted."""

import os
import socket
import time

import pytest

from stage_core import hookimpl
from stage_core.api import UsageError, main
from stage_core.records import ModelSpec
from stage_core.testing import fresh_host, toy_plugin
from stage_search import executors, units
from stage_search.sweep import run_sweep

GRID = '[base]\nmodel = "toy"\n[grid]\nseq-len = [16, 32]\n'


def sweep(host, capsys, spec, out, *more):
    capsys.readouterr()
    status = main(["sweep", str(spec), "-o", str(out), "--workers", "1", *map(str, more)], host=host)
    return status, capsys.readouterr().err


@pytest.fixture
def grid(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    return path


def test_a_users_table_is_refused_before_any_work_and_replaced_with_force(toy_host, tmp_path, capsys, grid):
    # `stage sweep -o FILE.csv` replaced any file with that suffix, without a word
    mine = tmp_path / "results.csv"
    mine.write_text("run,loss\n1,0.3\n")
    status, err = sweep(toy_host, capsys, grid, mine, "--cache", tmp_path / "c")
    assert status == 2 and err.count("\n") == 1
    assert "-o " + str(mine) + ": exists and STAGE did not write it; give another name, or --force" in err
    assert mine.read_text() == "run,loss\n1,0.3\n" and not (tmp_path / "c").exists()  # nothing evaluated
    assert sweep(toy_host, capsys, grid, mine, "--cache", tmp_path / "c", "--force")[0] == 0
    assert mine.read_text().startswith("unit,model,seq-len,status,")
    status, err = sweep(toy_host, capsys, grid, mine, "--cache", tmp_path / "c")  # a sweep's own: replaced
    assert status == 0 and "2 cached" in err
    assert sorted(os.listdir(tmp_path)) == ["c", "grid.toml", "results.csv"]  # no temporary file


@pytest.mark.parametrize("make,needle", [
    (lambda p: os.mkfifo(p), "is a FIFO"),
    (lambda p: p.symlink_to(p.parent / "elsewhere.csv"), "is a symbolic link"),
    (lambda p: socket.socket(socket.AF_UNIX).bind(str(p)), "is a socket"),
])
def test_what_is_not_a_regular_file_is_never_replaced(toy_host, tmp_path, capsys, grid, make, needle):
    out = tmp_path / "t.csv"
    make(out)
    status, err = sweep(toy_host, capsys, grid, out, "--force", "--cache", tmp_path / "c")
    assert status == 2 and needle in err and not (tmp_path / "c").exists()


def test_a_bad_output_path_is_refused_before_any_work(toy_host, tmp_path, capsys, grid):
    # it used to run every point, then die with a traceback writing the table
    (tmp_path / "afile").write_text("x")
    status, err = sweep(toy_host, capsys, grid, tmp_path / "afile" / "t.csv", "--cache", tmp_path / "c")
    assert status == 2 and err.count("\n") == 1 and "a part of the path is a file" in err
    assert not (tmp_path / "c").exists()


def test_the_spec_is_never_the_table(toy_host, tmp_path, capsys):
    spec = tmp_path / "grid.json"  # (TOML, whatever its name)
    spec.write_text(GRID)
    status, err = sweep(toy_host, capsys, spec, spec, "--force", "--cache", tmp_path / "c")
    assert status == 2 and "which this command reads" in err and spec.read_text() == GRID


class Broken:
    """A model whose build fails for one config: a plugin's bug, not a user's mistake."""

    @hookimpl
    def stage_models(self):
        from stage_core.testing import ToyConfig, build_toy

        def build(config):
            if config.layers == 3:
                raise ZeroDivisionError("a bug for three layers")
            return build_toy(config)

        return [ModelSpec("broken", "broken", build, {"broken": ToyConfig(name="broken")}, ToyConfig.from_dict)]


def test_one_failing_point_is_a_row_and_the_sweep_goes_on(tmp_path, capsys, monkeypatch):
    from stage_search import plugin

    host = fresh_host((toy_plugin, "toy"), (Broken(), "broken"), (plugin, "search"))
    monkeypatch.setattr(units, "_host", lambda: host)
    (tmp_path / "g.toml").write_text('[base]\nmodel = "broken"\n[grid]\nset = ["layers=2", "layers=3"]\n')
    out = tmp_path / "t.json"
    status, err = sweep(host, capsys, tmp_path / "g.toml", out, "--cache", tmp_path / "c")
    assert status == 0, err
    import json

    rows = json.loads(out.read_text())
    assert [r["status"] for r in rows] == ["ok", "failed"]
    assert "ZeroDivisionError: a bug for three layers" in rows[1]["error"]
    assert "2 rows (1 ok, 0 invalid plans, 1 failed)" in err
    # a failed point is not cached: the next run tries it again
    assert sweep(host, capsys, tmp_path / "g.toml", out, "--cache", tmp_path / "c")[1].startswith(
        "2 points: 1 cached, 1 to evaluate")


def _pid(_):
    time.sleep(0.2)  # (so both items are in flight at once)
    return os.getpid()


def test_workers_never_exceed_the_items():
    # `sweep --workers 150` for 2 points started 150 processes
    pids = dict(executors.local(_pid, [0, 1], {"workers": 150}))
    assert len(pids) == 2 and len(set(pids.values())) <= 2 and os.getpid() not in pids.values()
    assert dict(executors.local(_pid, [0], {"workers": 150})) == {0: os.getpid()}  # one item: no pool


def test_a_grid_is_counted_before_it_is_expanded(toy_host, tmp_path, capsys):
    values = list(range(1, 101))
    (tmp_path / "g.toml").write_text('[base]\nmodel = "toy"\n[grid]\n' + "\n".join(
        f"{k} = {values}" for k in ("dp", "tp", "micro-batches", "micro-batch-size", "seq-len")))
    started = time.perf_counter()
    status, err = sweep(toy_host, capsys, tmp_path / "g.toml", tmp_path / "t.csv")
    assert status == 2 and time.perf_counter() - started < 10
    assert "the grid has 10,000,000,000 points, above the 100,000 one sweep evaluates" in err


def test_a_world_above_the_limit_is_an_invalid_row(toy_host, tmp_path, capsys):
    (tmp_path / "g.toml").write_text('[base]\nmodel = "toy"\n[grid]\ndp = [1, 1073741824]\n')
    out = tmp_path / "t.json"
    assert sweep(toy_host, capsys, tmp_path / "g.toml", out, "--cache", tmp_path / "c")[0] == 0
    import json

    big = json.loads(out.read_text())[1]
    assert big["status"] == "invalid" and "above the 1,048,576 ranks STAGE lays out" in big["error"]


# --------------------------------------------------------------------------- search flags


@pytest.mark.parametrize("flag,value,needle", [
    ("--gpu-memory", "0", "--gpu-memory 0: must be a positive number of GiB"),  # replaced by the GPU's before
    ("--gpu-memory", "nan", "--gpu-memory nan: must be a positive number of GiB"),
    ("--gpu-memory", "inf", "--gpu-memory inf: must be a positive number of GiB"),
    ("--max-pp", "0", "--max-pp 0: must be 1 or more"),
    ("--global-batch", "0", "--global-batch 0: must be 1 or more"),
    ("--seq-len", "0", "--seq-len 0: must be 1 or more"),
    ("--micro-batch-size", "-2", "--micro-batch-size -2: must be 1 or more"),
    ("--candidates", "0", "--candidates 0: must be 1 or more"),
    ("--gpus", "1000000007", "--gpus 1,000,000,007: above the 1,048,576 ranks STAGE lays out"),
])
def test_search_refuses_what_means_nothing(toy_host, capsys, flag, value, needle):
    argv = ["search", "--model", "toy", "--gpus", "8", "--no-simulate", flag, value]
    started = time.perf_counter()
    assert main(argv, host=toy_host) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    assert time.perf_counter() - started < 10  # --gpus 1000000007 ran on, unbounded


def test_run_sweep_refuses_the_output_rule_too(toy_host, tmp_path, grid):
    (tmp_path / "x.csv").write_text("mine")
    with pytest.raises(UsageError, match="STAGE did not write it"):
        run_sweep(grid, tmp_path / "x.csv", workers=1, cache=tmp_path / "c")


def test_sweep_refuses_an_executor_setting_the_executor_does_not_read(tmp_path, capsys):
    from stage_core.api import main

    spec = tmp_path / "grid.toml"
    spec.write_text('[base]\nmodel = "toy"\n[grid]\ndp = [1, 2]\n')
    status = main(["sweep", str(spec), "-o", str(tmp_path / "t.csv"), "--address", "ray://x:10001", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err == ["stage: error: --address ray://x:10001: the local executor does not read it "
                                   "(it reads: --workers); leave it out, or choose another --executor"]
    assert not (tmp_path / "t.csv").exists()
