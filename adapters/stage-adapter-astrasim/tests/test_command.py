"""The command end to end: no-binary mode, a fake simulator, errors, the plugin hook."""

from __future__ import annotations

import argparse
import io
import json
import os
import re

import pytest
from stage_core.testing import fresh_host
from stage_core.api import UsageError

from stage_adapter_astrasim import command, plugin, simulate
from stage_adapter_astrasim.command import configure, run, run_astrasim

FLAGS = ("--workload-configuration=", "--comm-group-configuration=",
         "--system-configuration=", "--network-configuration=",
         "--remote-memory-configuration=")


@pytest.fixture(autouse=True)
def _test_presets(host, monkeypatch):
    """The command's default host is one with the test presets only."""
    monkeypatch.setattr(command, "PluginHost", lambda: host)
    monkeypatch.setattr(simulate, "PluginHost", lambda: host)


def _run(trace_dir, **kw):
    out, err = io.StringIO(), io.StringIO()
    kw.setdefault("env", {})
    status = run_astrasim(trace_dir, out=out, err=err, **kw)
    return status, out.getvalue(), err.getvalue()


def test_without_a_binary_prints_the_command(make_trace_set):
    root = make_trace_set(8)
    status, out, _ = _run(root)
    assert status == 0
    for flag in FLAGS:
        assert flag in out
    work = root / "astrasim"
    assert f"--workload-configuration={root / 'trace'}" in out
    assert f"--comm-group-configuration={root / 'comm_groups.json'}" in out
    assert f"--system-configuration={work / 'system.json'}" in out
    assert f"--network-configuration={work / 'network.yml'}" in out
    assert f"--remote-memory-configuration={work / 'memory.json'}" in out
    assert "<ASTRA-sim analytical binary>" in out
    assert sorted(p.name for p in work.iterdir()) == [".stage-folder.json", "memory.json", "network.yml",
                                                      "system.json"]  # (the mark: -o replaces the set with it)


def test_without_a_binary_json(make_trace_set):
    root = make_trace_set(8)
    status, out, _ = _run(root, as_json=True)
    payload = json.loads(out)
    assert status == 0
    assert payload["argv"][1] == f"--workload-configuration={root / 'trace'}"
    assert all(any(a.startswith(f) for a in payload["argv"]) for f in FLAGS)


def test_configs_are_replaced_atomically(make_trace_set):
    root = make_trace_set(16)
    (root / "astrasim").mkdir()
    (root / "astrasim" / "results.json").write_text("stale")
    _run(root, system="a100")
    assert not (root / "astrasim" / "results.json").exists()
    assert "npus_count: [ 8, 2 ]" in (root / "astrasim" / "network.yml").read_text()
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []


def test_fake_simulator_end_to_end(make_trace_set, fake_simulator, sample_stdout):
    root = make_trace_set(8)
    binary = fake_simulator(sample_stdout)
    status, out, err = _run(root, astra_sim=str(binary))
    assert status == 0, err
    work = root / "astrasim"
    assert (work / "stdout.txt").read_text() == sample_stdout
    argv = json.loads((work / "argv.json").read_text())  # the simulator ran in work/
    assert argv[1:] == [f"--workload-configuration={root / 'trace'}",
                        f"--comm-group-configuration={root / 'comm_groups.json'}",
                        f"--system-configuration={work / 'system.json'}",
                        f"--network-configuration={work / 'network.yml'}",
                        f"--remote-memory-configuration={work / 'memory.json'}",
                        f"--logging-configuration={work / 'logging.toml'}"]  # the per-node log
    results = json.loads((work / "results.json").read_text())
    assert results["summary"]["max_finish_time_ns"] == 207_616_180
    assert results["summary"]["deadlocked_ranks"] == []
    by_rank = {row["rank"]: row for row in results["ranks"]}
    assert [by_rank[r]["finish_time_ns"] for r in range(8)] == [207_616_180] * 4 + [
        138_672_922] * 4
    assert by_rank[4]["comm_time_ns"] == 46_888_219
    assert re.search(r"^0-3\s+207\.616", out, re.M)
    assert re.search(r"^4-7\s+138\.673", out, re.M)


def test_binary_from_the_environment(make_trace_set, fake_simulator, sample_stdout):
    root = make_trace_set(8)
    binary = fake_simulator(sample_stdout)
    status, out, _ = _run(root, env={"ASTRA_SIM_BIN": str(binary)}, as_json=True)
    assert status == 0
    assert json.loads(out) == json.loads((root / "astrasim" / "results.json").read_text())


def test_binary_from_path_by_astra_sims_names(make_trace_set, fake_simulator, sample_stdout,
                                              tmp_path):
    """Each backend finds its own binary on PATH, by the name astra-sim's build scripts give it."""
    root = make_trace_set(8)
    aware = fake_simulator(sample_stdout, name="AstraSim_Analytical_Congestion_Aware")
    status, out, _ = _run(root, env={"PATH": str(aware.parent)}, as_json=True)
    assert status == 0 and "astra_sim" not in json.loads(out)  # the analytical backend's is not there: the command
    status, out, _ = _run(root, env={"PATH": str(aware.parent)}, as_json=True, backend="analytical-aware")
    assert status == 0 and json.loads(out)["astra_sim"] == str(aware)
    assert json.loads(out)["backend"] == "analytical-aware"
    unaware = fake_simulator(sample_stdout, name="AstraSim_Analytical_Congestion_Unaware")
    status, out, _ = _run(root, env={"PATH": f"{tmp_path / 'elsewhere'}:{aware.parent}"},
                          as_json=True)
    assert json.loads(out)["astra_sim"] == str(unaware)


def test_option_then_environment_then_path(make_trace_set, fake_simulator, sample_stdout):
    root = make_trace_set(8)
    on_path = fake_simulator(sample_stdout, name="AstraSim_Analytical_Congestion_Unaware")
    from_env = fake_simulator(sample_stdout, name="from_env")
    given = fake_simulator(sample_stdout, name="given")
    env = {"PATH": str(on_path.parent), "ASTRA_SIM_BIN": str(from_env)}
    _, out, _ = _run(root, env=env, as_json=True)
    assert json.loads(out)["astra_sim"] == str(from_env)
    _, out, _ = _run(root, env=env, astra_sim=str(given), as_json=True)
    assert json.loads(out)["astra_sim"] == str(given)


UNRELEASED = "[x] [HardwareResource] [critical] !!!Hardware Resource sys.id={} has unreleased nodes!!!"


def _without_finish(stdout: str, ranks: str) -> str:
    return "\n".join(l for l in stdout.splitlines() if not re.search(rf"sys\[[{ranks}]\] finished", l))


def test_deadlock_exits_1_and_names_the_ranks(make_trace_set, fake_simulator,
                                              sample_stdout):
    root = make_trace_set(8)
    cut = _without_finish(sample_stdout, "67") + "\n" + UNRELEASED.format(6) + "\n" + UNRELEASED.format(7)
    status, out, err = _run(root, astra_sim=str(fake_simulator(cut)))
    assert status == 1
    assert "DEADLOCK: ranks 6-7 never finished (2 of 8)" in out and "error:" not in err
    summary = json.loads((root / "astrasim" / "results.json").read_text())["summary"]
    assert (summary["outcome"], summary["deadlocked_ranks"], summary["unfinished_ranks"]) == ("deadlock", [6, 7], [6, 7])


def test_missing_finish_lines_without_a_deadlock_are_not_called_one(make_trace_set, fake_simulator, sample_stdout):
    root = make_trace_set(8)
    status, out, err = _run(root, astra_sim=str(fake_simulator(_without_finish(sample_stdout, "67"))))
    assert status == 1 and "DEADLOCK" not in out
    assert ("error: ranks 6-7 unfinished (2 of 8): they printed no 'finished' line, and ASTRA-sim (analytical) "
            "reported neither a deadlock nor an error (exit status 0)") in err
    summary = json.loads((root / "astrasim" / "results.json").read_text())["summary"]
    assert (summary["outcome"], summary["deadlock"], summary["deadlocked_ranks"], summary["unfinished_ranks"]) == (
        "incomplete", False, [], [6, 7])


def test_simulator_failure_exits_1_and_is_never_a_deadlock(make_trace_set, fake_simulator, sample_stdout):
    root = make_trace_set(8)
    status, out, err = _run(root, astra_sim=str(fake_simulator("", returncode=3)))
    assert status == 1
    assert "error: ASTRA-sim (analytical) exited with status 3 with ranks 0-7 unfinished (8 of 8): fake stderr" in err
    assert (root / "astrasim" / "stderr.txt").read_text() == "fake stderr\n"
    assert "DEADLOCK" not in out
    # an assertion after some ranks finished (a signal: the wrapper scripts exec the binary)
    killer = fake_simulator(_without_finish(sample_stdout, "4-7"), returncode=-6, name="aborts")
    killer.write_text(killer.read_text().replace("sys.exit(-6)", "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"))
    status, out, err = _run(root, astra_sim=str(killer))
    assert status == 1 and "DEADLOCK" not in out
    assert "ASTRA-sim (analytical) was killed by SIGABRT with ranks 4-7 unfinished (4 of 8): fake stderr" in err
    assert json.loads((root / "astrasim" / "results.json").read_text())["summary"]["outcome"] == "failed"


def test_bad_binary_is_a_usage_error(make_trace_set, tmp_path):
    root = make_trace_set(8)
    with pytest.raises(UsageError, match=r"--astra-sim .*no-such-sim not found"):
        _run(root, astra_sim=str(tmp_path / "no-such-sim"))
    with pytest.raises(UsageError, match=r"\$ASTRA_SIM_BIN .*nowhere"):
        _run(root, env={"ASTRA_SIM_BIN": str(tmp_path / "nowhere")})
    assert not (root / "astrasim").exists()  # nothing written before the check


def test_bad_preset_through_the_command(make_trace_set):
    with pytest.raises(UsageError, match="'tpu'"):
        _run(make_trace_set(8), system="tpu")


def test_not_a_trace_set(tmp_path):
    with pytest.raises(UsageError, match="manifest.json"):
        _run(tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        _run(tmp_path / "missing")


def test_missing_traces_are_named(make_trace_set):
    root = make_trace_set(8)
    os.unlink(root / "trace.3.et")
    with pytest.raises(UsageError, match=r"trace\.3\.et missing for world_size 8"):
        _run(root)


@pytest.mark.parametrize("manifest,message", [
    ("[" * 50_000 + "]" * 50_000, "nested too deep"),
    ('{"world_size": 1000000000000}', "world_size 1,000,000,000,000 is above the"),
    ("fifo", "not a regular file but a FIFO")])
def test_a_manifest_is_read_bounded(make_trace_set, manifest, message):
    """A manifest nested 50,000 deep, claiming 10^12 ranks, or a FIFO: one line, at once (the
    world is checked before one file per rank is looked for)."""
    root = make_trace_set(8)
    path = root / "manifest.json"
    os.unlink(path)
    if manifest == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(manifest)
    with pytest.raises(UsageError, match=message):
        _run(root)


def test_missing_comm_groups(make_trace_set):
    root = make_trace_set(8)
    os.unlink(root / "comm_groups.json")
    with pytest.raises(UsageError, match="comm_groups.json"):
        _run(root)


def test_world_size_that_does_not_fit(make_trace_set):
    with pytest.raises(UsageError, match="world size 12"):
        _run(make_trace_set(12))


def test_argparse_and_run(make_trace_set, fake_simulator, sample_stdout, capsys):
    root = make_trace_set(8)
    p = argparse.ArgumentParser()
    configure(p)
    args = p.parse_args([str(root), "--astra-sim", str(fake_simulator(sample_stdout)),
                         "--system", "a100", "--json"])
    assert run(args) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["system"] == "preset a100"
    defaults = p.parse_args([str(root)])
    assert (defaults.system, defaults.network, defaults.astra_sim, defaults.json) == (
        None, None, None, False)


def test_plugin_registers_the_command():
    specs = fresh_host((plugin, "astrasim")).commands()
    assert [s.name for s in specs] == ["astrasim"]
    assert specs[0].run.__wrapped__ is run and specs[0].configure.__wrapped__ is configure


def test_inference_sets_count_model_flops_once():
    """Training's model FLOPs are 3x the forward matmuls (Megatron-LM); an inference set's
    manifest already counts its forward matmuls once, and the convention line says so."""
    from stage_adapter_astrasim.steptime import job_results

    classes = [{"ranks": [0, 1], "flops": {"model": 4e12, "matmul": 4e12}}]
    for task, words in (("train", "3 x the forward"), ("decode", "the forward matmuls once")):
        out = job_results({"plan": {"task": task}, "world_size": 2, "rank_classes": classes}, 10**9, 1e15)
        assert words in out["flop_convention"]
        assert out["model_tflops_per_gpu"] == 4.0  # 4e12 FLOPs in one second


def test_the_simulator_record_says_why_it_cannot_run_and_runs_a_set(make_trace_set, fake_simulator, sample_stdout,
                                                                     host, monkeypatch, tmp_path):
    specs = fresh_host((plugin, "astrasim")).simulators()
    assert [(s.name, s.time_limit_s) for s in specs] == [("astrasim", None), ("astrasim-aware", None),
                                                         ("astrasim-htsim", 3.0)]
    spec = specs[0]
    assert spec.formats == ("chakra",)
    monkeypatch.delenv("ASTRA_SIM_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert "no ASTRA-sim analytical binary: set $ASTRA_SIM_BIN" in spec.available()
    monkeypatch.setenv("ASTRA_SIM_BIN", str(tmp_path / "missing"))
    assert "$ASTRA_SIM_BIN" in spec.available() and "not found" in spec.available()
    monkeypatch.setenv("ASTRA_SIM_BIN", str(fake_simulator(sample_stdout)))
    assert spec.available() is None
    got = spec.simulate.__wrapped__(make_trace_set(8), None)
    assert (got["step_time_s"], got["finished"]) == (207_616_180e-9, True)
    assert got["results"]["summary"]["deadlocked_ranks"] == []


# --------------------------------------------------------------------------- issue 26: the output rule


@pytest.mark.parametrize("where,needle", [
    (lambda root, tmp: "/dev/null", "is a character device"),  # as root it replaced /dev/null
    (lambda root, tmp: os.mkfifo(tmp / "fifo.json") or tmp / "fifo.json", "is a FIFO"),
    (lambda root, tmp: (tmp / "link.json").symlink_to(tmp / "x") or tmp / "link.json", "is a symbolic link"),
    (lambda root, tmp: root / "trace.3.et", "which this command reads"),  # a trace of the set it runs
    (lambda root, tmp: root / "astrasim" / "t.json", "which this command reads"),
])
def test_a_timeline_never_replaces_what_is_not_stages(make_trace_set, fake_simulator, sample_stdout, tmp_path,
                                                      where, needle):
    root = make_trace_set(8)
    binary = fake_simulator(sample_stdout)
    target = where(root, tmp_path)
    with pytest.raises(UsageError, match=needle):
        _run(root, astra_sim=str(binary), timeline_file=str(target), force=True, validate=False)
    assert not (root / "astrasim").exists()  # refused before the run: the simulator never ran
    assert (root / "trace.3.et").read_bytes() == b""


def test_a_users_file_needs_force_and_a_timeline_of_stages_does_not(make_trace_set, fake_simulator,
                                                                    sample_stdout, tmp_path):
    root = make_trace_set(8)
    binary = fake_simulator(sample_stdout)
    mine = tmp_path / "timeline.json"
    mine.write_text('{"traceEvents": [], "mine": true}')
    with pytest.raises(UsageError, match="exists and STAGE did not write it; give another name, or --force"):
        _run(root, astra_sim=str(binary), timeline_file=str(mine), validate=False)
    assert json.loads(mine.read_text())["mine"]
    assert _run(root, astra_sim=str(binary), timeline_file=str(mine), validate=False, force=True)[0] == 0
    doc = json.loads(mine.read_text())
    assert list(doc)[0] == "otherData" and doc["otherData"]["stage_version"]  # the mark, first
    assert _run(root, astra_sim=str(binary), timeline_file=str(mine), validate=False)[0] == 0  # STAGE's now
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file


def _timed_for(root, preset):
    """Mark a set as timed on ``preset`` (what stage generate --gpu writes in the manifest)."""
    from stage_core.api import hardware
    from astrasim_test_presets import TEST_PRESETS

    manifest = json.loads((root / "manifest.json").read_text())
    manifest.update(hardware=hardware.to_dict(TEST_PRESETS[preset]), compute_model="roofline",
                    rank_classes=[{"ranks": list(range(manifest["world_size"])), "compute_time_us": 1}])
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_the_first_line_says_what_times_the_kernels(make_trace_set):
    untimed = make_trace_set(8, "untimed")
    status, out, _ = _run(untimed, system="a100")
    first = out.splitlines()[0]
    assert status == 0 and first == ("kernels: untimed: the simulator's roofline times every kernel (peak-perf "
                                     "312.0 TFLOPS, local-mem-bw 2039.0 GB/s of preset a100)")
    timed = make_trace_set(8, "timed")
    _timed_for(timed, "a100")
    status, out, _ = _run(timed, as_json=True)
    payload = json.loads(out)
    assert (payload["compute_model"], payload["hardware"]) == ("roofline", "a100")
    assert payload["kernel_times"] == "roofline on a100 (the set's durations)"


def test_a_set_timed_for_another_gpu_is_refused_not_mixed(make_trace_set):
    root = make_trace_set(8)
    _timed_for(root, "a100")
    with pytest.raises(UsageError, match=r"^--system h100: the set was timed for a100 \(roofline on a100\), so the "
                                         r"simulator would run h100's network with a100's kernel times; generate the "
                                         r"set with --gpu h100 to time it there, or leave --system out$"):
        _run(root, system="h100")
    assert _run(root, system="a100")[0] == 0  # its own GPU: fine
