"""A damaged set is one line, exit 1, in `stage validate` and `stage astrasim` (issue 9,
point 2): the simulator never reads it."""

import os

import pytest

ASTRA_SIM = os.environ.get("ASTRA_SIM_BIN")


@pytest.fixture(scope="module")
def gpt_set(tmp_path_factory, host):
    from stage_core.flow import plan_job, write_trace_set
    from stage_core.parallel.plan import Plan

    out = tmp_path_factory.mktemp("damaged") / "set"
    write_trace_set(host, plan_job(host, "gpt-tiny", {}, Plan(pp=2, dp=2, micro_batches=2)), out)
    return out


def truncated(gpt_set, tmp_path):
    import shutil

    copy = tmp_path / "cut"
    shutil.copytree(gpt_set, copy)
    data = (copy / "trace.2.et").read_bytes()
    (copy / "trace.2.et").write_bytes(data[:len(data) // 2])
    return copy


def test_validate_names_the_rank_file_and_byte(run_stage, gpt_set, tmp_path):
    done = run_stage("validate", truncated(gpt_set, tmp_path))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "stage: error: rank 2: " in done.stderr and "trace.2.et: record at byte" in done.stderr


@pytest.mark.skipif(not ASTRA_SIM, reason="ASTRA_SIM_BIN is not set: no ASTRA-sim analytical binary")
def test_astrasim_refuses_a_truncated_set_before_running_the_simulator(run_stage, gpt_set, tmp_path):
    cut = truncated(gpt_set, tmp_path)
    done = run_stage("astrasim", cut, "--astra-sim", ASTRA_SIM)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "rank 2: " in done.stderr and "trace.2.et: record at byte" in done.stderr
    assert not (cut / "astrasim" / "stdout.txt").exists()  # the simulator never ran
