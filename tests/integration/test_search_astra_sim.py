"""stage search --astra-sim BIN (issue 25: the search's help named no way to give the
simulator): the binary runs the best plans; one that cannot do its job exits 2 at once."""

import json
import os

import pytest

from stage_core.cli import main

ASTRA_SIM = os.environ.get("ASTRA_SIM_BIN")
ARGV = ["search", "--model", "gpt-tiny", "--gpus", "4", "--seq-len", "256", "--tp", "1", "--micro-batch-size", "1",
        "--zero", "0", "--recompute", "none", "--top", "1", "--candidates", "1", "--json", "--quiet"]


@pytest.mark.skipif(not ASTRA_SIM, reason="ASTRA_SIM_BIN is not set: no ASTRA-sim analytical binary")
def test_the_binary_given_runs_the_best_plans(host, capsys, monkeypatch):
    monkeypatch.delenv("ASTRA_SIM_BIN")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # (no simulator on PATH: only --astra-sim gives it)
    assert main([*ARGV, "--astra-sim", ASTRA_SIM], host=host) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["simulator"] == {"ran": True, "simulator": "astrasim"}
    assert table["plans"][0]["simulated_step_time_s"] > 0
    assert "ASTRA_SIM_BIN" not in os.environ  # (set for the run only)
    assert main(ARGV, host=host) == 0  # without it: estimated only, and it says why
    assert json.loads(capsys.readouterr().out)["simulator"]["ran"] is False


@pytest.mark.parametrize("extra,line", [
    (["--astra-sim", "/nowhere/AstraSim"], "stage: error: --astra-sim /nowhere/AstraSim not found: give the path of "
                                           "the astrasim simulator's binary"),
    (["--astra-sim", "/bin/sh", "--no-simulate"], "stage: error: --astra-sim /bin/sh: names the simulator's binary, "
                                                  "and --no-simulate runs none"),
])
def test_a_binary_that_cannot_run_is_refused_before_any_work(host, capsys, extra, line):
    assert main([*ARGV, *extra], host=host) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
