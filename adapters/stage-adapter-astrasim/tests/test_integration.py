"""Runs the REAL ASTRA-sim analytical binary named by $ASTRA_SIM_BIN (skipped without)."""

from __future__ import annotations

import io
import json
import os

import pytest

from chakra_mini import write_trace_set
from stage_adapter_astrasim.command import run_astrasim

BIN = os.environ.get("ASTRA_SIM_BIN")

pytestmark = pytest.mark.skipif(
    not BIN, reason="ASTRA_SIM_BIN is not set: no ASTRA-sim analytical binary to run")


@pytest.mark.parametrize("world", [8, 16])
def test_real_simulator(tmp_path, world, host):
    root = tmp_path / "traces"
    write_trace_set(root, world)
    out, err = io.StringIO(), io.StringIO()
    status = run_astrasim(root, astra_sim=BIN, system="h100", out=out, err=err, host=host)
    stdout = (root / "astrasim" / "stdout.txt").read_text()
    assert status == 0, f"{out.getvalue()}\n{err.getvalue()}\n{stdout[-2000:]}"
    results = json.loads((root / "astrasim" / "results.json").read_text())
    summary = results["summary"]
    assert summary["deadlocked_ranks"] == []
    assert summary["finished_ranks"] == world
    # the GEMM alone: 2*4096^3 FLOPs at 989.4 TFLOPS is ~139 us
    assert summary["max_finish_time_ns"] > 100_000
    assert all(row["comm_time_ns"] > 0 for row in results["ranks"])
