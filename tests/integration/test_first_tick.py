"""ASTRA-sim aborts (EventQueue assertion, status -6) when a node finishes in 0 ns at
time 0.  Only a roofline run can meet it: a rank's first kernel under 1 ns (a tiny
embedding gather).  `stage generate` warns, `stage validate` says the simulator aborts (exit 1), `stage astrasim`
refuses in one line, and the simulator run by hand confirms the abort; timed with --gpu, the
same set finishes and validates."""

import subprocess

import pytest
from conftest import ASTRA_SIM, NO_SIMULATOR

DECODE = ["--model", "llama-tiny", "--task", "decode", "--tp", "2", "--micro-batch-size", "1",
          "--context-len", "64"]


def test_a_zero_time_first_kernel_is_warned_refused_and_really_aborts(run_stage, tmp_path):
    if not ASTRA_SIM:
        pytest.skip(NO_SIMULATOR)
    out = tmp_path / "tiny"
    made = run_stage("generate", *DECODE, "--gpu", "none", "-o", out)  # untimed: the roofline
    assert made.returncode == 0, made.stderr
    # the embedding gather reads one token's row: 1 x 256 x 2 bytes plus its 8-byte id
    assert "first kernel of ranks 0-1 (mb0.fwd.embed, 520 bytes)" in made.stderr
    assert "a100, h100" in made.stderr
    # validate agrees with the warning and with the simulator below (it said "every rank finishes")
    checked = run_stage("validate", out)
    assert checked.returncode == 1 and checked.stdout == "" and checked.stderr.count("\n") == 1
    assert (f"{out}: 2 ranks, valid; but ASTRA-sim aborts at its first tick on the roofline of a100, h100: the "
            f"first kernel of ranks 0-1, node 0 (mb0.fwd.embed, 1 FLOPs, 520 bytes), takes under 1 ns") in checked.stderr

    refused = run_stage("astrasim", out, "--astra-sim", ASTRA_SIM)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "node 0 (mb0.fwd.embed, 1 FLOPs, 520 bytes)" in refused.stderr
    assert not (out / "astrasim" / "stdout.txt").exists()  # the simulator never ran

    # what `stage astrasim` refuses to do: 520 B at 3,350 GB/s is 0.16 ns, truncated to 0
    assert run_stage("astrasim", out, env={"ASTRA_SIM_BIN": "", "PATH": ""}).returncode == 0  # configs only
    cfg = out / "astrasim"
    ran = subprocess.run([ASTRA_SIM, f"--workload-configuration={out}/trace",
                          f"--comm-group-configuration={out}/comm_groups.json",
                          f"--system-configuration={cfg}/system.json", f"--network-configuration={cfg}/network.yml",
                          f"--remote-memory-configuration={cfg}/memory.json"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert ran.returncode == -6 and "finished" not in ran.stdout
    assert "EventQueue" in ran.stderr


def test_timed_the_same_set_finishes(run_stage, tmp_path, simulate):
    out = tmp_path / "timed"
    made = run_stage("generate", *DECODE, "--gpu", "h100", "-o", out)
    assert made.returncode == 0 and "warning" not in made.stderr
    checked = run_stage("validate", out)
    assert checked.returncode == 0 and "every rank finishes in ASTRA-sim" in checked.stdout
    status, results = simulate(out)
    assert status == 0 and results["summary"]["finished_ranks"] == 2
