"""Issue 25 in the adapter: --timeline and --plot need a run; the run's progress; its serving lines."""

from __future__ import annotations

import io
import os

import pytest

from stage_adapter_astrasim import command, runner, simulate
from stage_adapter_astrasim.command import run_astrasim
from stage_core.api import Progress, UsageError


@pytest.fixture(autouse=True)
def _test_presets(host, monkeypatch):
    monkeypatch.setattr(command, "PluginHost", lambda: host)
    monkeypatch.setattr(simulate, "PluginHost", lambda: host)


@pytest.mark.parametrize("flag", ["timeline_file", "plot_file"])
def test_a_timeline_without_a_simulator_is_refused_and_nothing_is_written(make_trace_set, tmp_path, flag):
    pytest.importorskip("matplotlib") if flag == "plot_file" else None
    root = make_trace_set(8)
    before = sorted(p.name for p in root.iterdir())
    target = tmp_path / ("t.json" if flag == "timeline_file" else "t.png")
    with pytest.raises(UsageError) as caught:
        run_astrasim(root, env={"PATH": ""}, out=io.StringIO(), err=io.StringIO(), **{flag: str(target)})
    name = "--timeline" if flag == "timeline_file" else "--plot"
    assert str(caught.value) == (f"{name} {target}: draws the simulated step, and there is no ASTRA-sim analytical "
                                 "binary to run (--astra-sim BIN, $ASTRA_SIM_BIN, or AstraSim_Analytical_Congestion_"
                                 "Unaware on PATH); nothing was written")
    assert sorted(p.name for p in root.iterdir()) == before and not target.exists()  # (no astrasim/ folder)


def test_the_cli_exits_2_for_it(make_trace_set, tmp_path, monkeypatch, capsys, host):
    from stage_core.api import main

    root = make_trace_set(8)
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("ASTRA_SIM_BIN", raising=False)
    assert main(["astrasim", str(root), "--timeline", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stage: error: --timeline {tmp_path / 't.json'}: draws the simulated")


def test_the_run_reports_each_rank_finishing_as_the_simulator_prints_it(fake_simulator, make_trace_set, tmp_path,
                                                                        sample_stdout):
    lines = [line for line in sample_stdout.splitlines() if " finished," in line]
    assert len(lines) == 8  # (the sample: eight ranks' finished lines)
    script = fake_simulator(sample_stdout)
    root = make_trace_set(8)
    told: list[int] = []
    paths = runner.SimPaths(workload=root / "trace", comm_groups=root / "comm_groups.json", system=root / "s",
                            network=root / "n", memory=root / "m")
    work = tmp_path / "work"
    work.mkdir()
    done = runner.run(script, paths, work, progress=told.append)
    assert done.returncode == 0 and sum(told) == 8


def test_astrasim_shows_its_phases_in_a_log(fake_simulator, make_trace_set, sample_stdout):
    root = make_trace_set(8)
    log = io.StringIO()
    progress = Progress("lines", stream=log, delay=0, prefix="stage astrasim")
    run_astrasim(root, astra_sim=str(fake_simulator(sample_stdout)), env={}, out=io.StringIO(), err=io.StringIO(),
                 validate=False, progress=progress)
    lines = log.getvalue().splitlines()
    assert lines[-1].startswith("stage astrasim: simulating (analytical): 8 of 8 ranks finished (100%) in ")
