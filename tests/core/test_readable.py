"""Issue 25: numbers that explain themselves, one memory convention, -o with STAGE's own
outputs in a set, stage models without building.  The toy model (108,288 parameters:
2 layers of hidden 64, ffn 256, vocabulary 128, counted by hand below) and a
data-parallel strategy that all-reduces every gradient."""

import json
import os

import pytest

from stage_core import hardware, hookimpl
from stage_core.cli import main
from stage_core.output import FOLDER_MARK, stage_mark, write_output, write_output_folder
from stage_core.records import ModelSpec, PlanSpec
from stage_core.reporting import binary_unit, plural, ranks_range, si_unit, table
from stage_core.testing import ToyConfig, build_toy, fresh_host, jsonl_plugin, toy_plugin

from conftest import DP, tiny_gpu

H, F, V, LAYERS = 64, 256, 128, 2
#: per layer: ln1 2h, qkv 3h*h + 3h, out h*h + h, ln2 2h, fc1 h*f + f, fc2 f*h + h; then the
#: embedding V*h (tied with the head) and the final norm 2h
PARAMS = LAYERS * (2 * H + 3 * H * H + 3 * H + H * H + H + 2 * H + H * F + F + F * H + H) + V * H + 2 * H
GRAD_BYTES = 2 * PARAMS  # bf16 gradients (--grad-dtype's default)


class Plans:
    @hookimpl
    def stage_plans(self):
        return [PlanSpec("toy-dp4", {"model": "toy", "dp": 4, "global-batch": 16, "seq-len": 16})]


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"), (Plans(), "plans"))


def run(host, capsys, *argv):
    status = main(list(argv), host=host)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_the_toy_has_the_hand_counted_parameters():
    from stage_core.models import param_counts

    assert PARAMS == 108_288 and param_counts(build_toy(ToyConfig())) == (PARAMS, PARAMS)


# --------------------------------------------------------------------------- wire bytes


@pytest.mark.parametrize("kind,size,n,wire", [
    ("all_reduce", 1000, 4, 1500),  # 2 (n-1)/n of the buffer
    ("all_reduce", 1000, 2, 1000),
    ("reduce_scatter", 1000, 4, 750),  # (n-1)/n of the whole input
    ("all_to_all", 1000, 4, 750),
    ("all_gather", 1000, 4, 3000),  # comm_size is the shard: n-1 of them arrive, n-1 leave
    ("send", 1000, 2, 1000), ("recv", 1000, 2, 1000),
    ("all_reduce", 1000, 1, 0),  # a group of one moves nothing
    ("all_reduce", 1001, 3, 1334),  # whole bytes, rounded down (2 x 2 x 1001 / 3 = 1334.67)
])
def test_wire_bytes_of_the_ring_algorithm_by_hand(kind, size, n, wire):
    assert hardware.wire_bytes(kind, size, n) == wire


@pytest.mark.parametrize("dp,wire", [(2, GRAD_BYTES), (4, 3 * GRAD_BYTES // 2), (8, 7 * GRAD_BYTES // 4)])
def test_the_gradient_all_reduce_puts_2_n_minus_1_over_n_on_the_wire(host, capsys, dp, wire):
    status, out, _ = run(host, capsys, "report", "--model", "toy", "--dp", str(dp), "--json")
    rc = json.loads(out)["rank_classes"][0]
    assert status == 0
    assert rc["comm_bytes"]["all_reduce"] == GRAD_BYTES == 216_576  # the input: every gradient, bf16
    assert rc["wire_bytes"]["all_reduce"] == wire
    assert set(rc["wire_bytes"]) == set(rc["comm_bytes"])


def test_report_text_is_one_table_in_named_units(host, capsys):
    status, out, err = run(host, capsys, "report", "--model", "toy", "--dp", "4")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "toy  dp4 mbs1x1 seq32  world 4"
    assert lines[1] == f"parameters: 0.11 M total, 0.11 M active per token ({PARAMS:,})"
    header = next(line for line in lines if line.startswith("ranks"))
    assert header.split()[:3] == ["ranks", "matmul", "MFLOP"] and "memory MiB" in header
    row = lines[lines.index(header) + 1].split()
    assert row[0] == "0-3"  # one row for the one rank class, its ranks as a range
    # traffic: the all-reduce's input and its wire bytes side by side, in kB (10^3 bytes)
    traffic = lines.index("traffic per rank (kB)")
    assert lines[traffic + 1].split() == ["ranks", "all-reduce", "input", "wire", "wire", "sent"]
    assert lines[traffic + 2].split() == ["0-3", f"{GRAD_BYTES / 1e3:.1f}", f"{1.5 * GRAD_BYTES / 1e3:.1f}",
                                          f"{1.5 * GRAD_BYTES / 1e3:.1f}"]
    assert lines[traffic + 3].startswith("(input: the collectives' comm_size as the trace gives it to ASTRA-sim")


def test_a_report_without_traffic_says_none(host, capsys):
    status, out, _ = run(host, capsys, "report", "--model", "toy", "--dp", "1")
    assert status == 0 and "traffic per rank: none" in out.splitlines()


# --------------------------------------------------------------------------- units and ranges


def test_units_are_binary_for_memory_and_decimal_for_traffic_and_flops():
    assert binary_unit(80 * 2**30) == ("GiB", 2**30) and binary_unit(3 * 2**20) == ("MiB", 2**20)
    assert binary_unit(2048 * 2**30) == ("TiB", 2**40) and binary_unit(512) == ("B", 1)
    assert si_unit(4.8e15, "FLOP") == ("PFLOP", 10**15) and si_unit(46.2e9, "B") == ("GB", 10**9)
    assert si_unit(999, "B") == ("B", 1)
    assert plural(1, "rank class") == "1 rank class" and plural(3, "rank class") == "3 rank classes"
    assert plural(2, "rank") == "2 ranks"


@pytest.mark.parametrize("ranks,text", [
    (range(512), "0-511"),
    ([0, 1, 2, 3, 8, 9], "0-3,8-9"),
    ([r for b in range(0, 8192, 128) for r in range(b, b + 8)], "0-7,128-135,...,8064-8071 (64x8)"),
    (list(range(0, 64, 8)), "0,8,...,56 (8 ranks)"),
    ([0, 1, 5, 9, 10, 11, 20, 30], "0-1,5,...,30 (8 ranks)"),  # (uneven blocks: the count of ranks)
])
def test_rank_lists_as_ranges(ranks, text):
    assert ranks_range(list(ranks)) == text
    assert ranks_range(__import__("stage_core").rankset.ranks_text(ranks)) == text  # (its text form too)


def test_a_table_aligns_its_columns():
    assert table(["name", "n"], [["a", "1"], ["bbb", "22"]], left=1) == ["name   n", "a      1", "bbb   22"]


# --------------------------------------------------------------------------- memory beside the GPU


def test_generate_says_when_a_rank_does_not_fit_its_gpu(capsys, tmp_path):
    small = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"), (tiny_gpu(2**-12), "hw"))
    status, out, err = run(small, capsys, "generate", "--model", "toy", "--dp", "2", "--gpu", "tiny",
                           "--format", "jsonl", "-o", str(tmp_path / "a"))
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    used = manifest["rank_classes"][0]["memory_bytes"]["total"]
    assert status == 0 and used > 2**18  # the set is written; the line says it does not fit
    share = f"{100 * used / 2**18:.0f}%"
    assert err.splitlines() == [f"stage: warning: memory: up to {used / 2**30:,.2f} GiB per GPU of the tiny's "
                                f"{2**-12:g} GiB ({share}): does NOT fit"]
    big = fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"), (tiny_gpu(80), "hw"))
    status, out, err = run(big, capsys, "generate", "--model", "toy", "--dp", "2", "--gpu", "tiny",
                           "--format", "jsonl", "-o", str(tmp_path / "b"))
    assert status == 0 and err == "" and out.splitlines()[-1].endswith("of the tiny's 80 GiB (0%): fits")


def test_decode_capacity_is_80_gib_unless_told_and_says_where_it_came_from(host, capsys):
    status, out, _ = run(host, capsys, "report", "--model", "toy", "--task", "decode", "--json")
    inf = json.loads(out)["inference"]
    assert inf["gpu_memory_bytes"] == 80 * 2**30 and inf["gpu_memory_from"] == "default"
    status, out, _ = run(host, capsys, "report", "--model", "toy", "--task", "decode")
    line = out.splitlines()[-1]
    assert line.startswith("largest batch in 80.00 GiB per GPU (the default; --gpu NAME or --gpu-memory GiB for yours)")
    status, out, _ = run(host, capsys, "report", "--model", "toy", "--task", "decode", "--gpu-memory", "40", "--json")
    assert json.loads(out)["inference"]["gpu_memory_bytes"] == 40 * 2**30


# --------------------------------------------------------------------------- a named plan's batch


def test_an_override_that_changes_a_named_plans_global_batch_is_said(host, capsys):
    status, out, err = run(host, capsys, "report", "--plan", "toy-dp4", "--micro-batches", "1", "--json")
    assert status == 0 and json.loads(out)["plan"]["global_batch"] == 4
    assert err.splitlines() == ["stage: note: plan toy-dp4: its global batch of 16 sequences becomes 4 with "
                                "--micro-batches 1 (dp 4 x micro-batch size 1 x 1 micro-batches); give "
                                "--global-batch 16 to keep it"]
    status, out, err = run(host, capsys, "report", "--plan", "toy-dp4", "--dp", "2", "--json")
    assert status == 0 and json.loads(out)["plan"]["global_batch"] == 16 and err == ""  # (kept: 8 micro-batches)
    status, out, err = run(host, capsys, "report", "--plan", "toy-dp4", "--micro-batch-size", "2", "--json")
    assert status == 0 and json.loads(out)["plan"]["global_batch"] == 16 and err == ""


# --------------------------------------------------------------------------- -o and STAGE's outputs in a set


def test_o_replaces_a_set_with_the_outputs_stage_wrote_in_it(host, capsys, tmp_path):
    out = tmp_path / "set"
    argv = ["generate", "--model", "toy", "--dp", "2", "--format", "jsonl", "-o", str(out)]
    assert run(host, capsys, *argv)[0] == 0
    set_files = sorted(os.listdir(out))
    # what stage astrasim leaves: its folder (marked), with what the simulator added to it
    write_output_folder(out / "astrasim", {"system.json": "{}", "network.yml": ""}, "stage astrasim",
                        replaceable=lambda folder: True)
    assert json.loads((out / "astrasim" / FOLDER_MARK).read_text())["stage_version"]
    (out / "astrasim" / "log").mkdir()
    (out / "astrasim" / "stdout.txt").write_text("sys[0] finished\n")
    # a timeline STAGE wrote (its mark first) and a plot
    (out / "timeline.json").write_text(json.dumps({"otherData": stage_mark(), "traceEvents": []}))
    status, _, err = run(host, capsys, *argv)
    assert status == 0, err
    assert sorted(os.listdir(out)) == set_files  # the set again, and only the set


@pytest.mark.parametrize("what", ["a file of the user's", "a folder STAGE did not mark", "a link to a marked folder"])
def test_o_still_refuses_what_stage_did_not_write(host, capsys, tmp_path, what):
    out = tmp_path / "set"
    argv = ["generate", "--model", "toy", "--dp", "2", "--format", "jsonl", "-o", str(out)]
    assert run(host, capsys, *argv)[0] == 0
    if what == "a file of the user's":
        (out / "notes.txt").write_text("mine")
        name = "notes.txt"
    elif what == "a folder STAGE did not mark":
        (out / "astrasim").mkdir()
        (out / "astrasim" / "results.json").write_text("{}")
        name = "astrasim/"
    else:
        write_output_folder(tmp_path / "elsewhere", {"a.txt": "x"}, "stage astrasim", replaceable=lambda f: True)
        (out / "astrasim").symlink_to(tmp_path / "elsewhere")
        name = "astrasim"
    before = sorted(os.listdir(out))
    status, _, err = run(host, capsys, *argv)
    assert status == 2 and len(err.splitlines()) == 1 and f"holds files STAGE did not write ({name})" in err, err
    assert sorted(os.listdir(out)) == before


def test_a_file_written_by_write_output_in_a_set_counts_as_stages(tmp_path):
    from stage_core.output import stage_output

    (tmp_path / "t.json").write_text(json.dumps({**stage_mark(), "x": 1}))
    (tmp_path / "u.json").write_text(json.dumps({"x": 1, **stage_mark()}))  # (the mark must come first)
    write_output(tmp_path / "p.json", json.dumps(stage_mark()), "--plot")
    assert stage_output(tmp_path / "t.json") and stage_output(tmp_path / "p.json")
    assert not stage_output(tmp_path / "u.json")


# --------------------------------------------------------------------------- stage models, built once


def counting_host(calls: list, presets: dict):
    from stage_core import flow

    flow._GRAPHS.clear()  # (the graphs of the last models planned, kept in this process)

    def build(config):
        calls.append(config.name)
        return build_toy(config)

    class Toy:
        @hookimpl
        def stage_models(self):
            return [ModelSpec(name="toy", family="toy", build=build, presets=presets, from_dict=ToyConfig.from_dict)]

    return fresh_host((Toy(), "toy"))


def test_stage_models_counts_each_preset_once_then_reads_the_counts(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STAGE_CACHE_DIR", str(tmp_path / "cache"))
    calls: list = []
    presets = {"toy": ToyConfig(), "toy-wide": ToyConfig(name="toy-wide", hidden=128, ffn=512)}
    host = counting_host(calls, presets)
    status, first, _ = run(host, capsys, "models", "--json")
    assert status == 0 and sorted(calls) == ["toy", "toy-wide"]
    rows = {r["name"]: r for r in json.loads(first)}
    assert rows["toy"]["params_total"] == PARAMS
    calls.clear()
    status, again, _ = run(counting_host(calls, presets), capsys, "models", "--json")
    assert status == 0 and calls == [] and again == first  # nothing built: the counts were kept
    # a preset whose config changes is counted again; the others are not
    changed = {**presets, "toy-wide": ToyConfig(name="toy-wide", hidden=128, ffn=1024)}
    status, out, _ = run(counting_host(calls, changed), capsys, "models", "--json")
    assert calls == ["toy-wide"] and {r["name"]: r for r in json.loads(out)}["toy"] == rows["toy"]
    # a damaged cache file is counted again, never an error
    cache = tmp_path / "cache" / "preset-params.json"
    cache.write_text("{not json")
    calls.clear()
    assert run(counting_host(calls, presets), capsys, "models")[0] == 0 and sorted(calls) == ["toy", "toy-wide"]


def test_stage_models_keeps_nothing_when_told(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STAGE_CACHE_DIR", "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    calls: list = []
    presets = {"toy": ToyConfig()}
    for _ in range(2):
        assert run(counting_host(calls, presets), capsys, "models")[0] == 0
    assert calls == ["toy", "toy"] and os.listdir(tmp_path) == []


def test_stage_models_runs_where_its_cache_cannot_be_written(capsys, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("STAGE_CACHE_DIR", str(blocker / "cache"))  # (under a file: never a folder)
    status, out, err = run(counting_host([], {"toy": ToyConfig()}), capsys, "models")
    assert status == 0 and err == "" and out.splitlines()[1].split()[:4] == ["toy", "toy", "0.11", "M"]


# --------------------------------------------------------------------------- an option that cannot do its job


def test_an_option_that_cannot_do_its_job_is_refused(host, capsys):
    status, _, err = run(host, capsys, "report", "--model", "toy", "--gpu-memory", "40")
    assert status == 2 and err.splitlines() == [
        "stage: error: --gpu-memory 40: sizes the largest batch of --task prefill, decode or serve; a training "
        "plan's memory is shown beside its GPU's with --gpu NAME"]


def test_an_executor_refuses_a_setting_it_declares_it_does_not_read():
    from stage_core.errors import UsageError
    from stage_core.records import ExecutorSpec

    class Executors:
        @hookimpl
        def stage_executors(self):
            return [ExecutorSpec("here", lambda fn, items, options: iter(()), options=("workers",)),
                    ExecutorSpec("anything", lambda fn, items, options: iter(()))]

    host = fresh_host((Executors(), "executors"))
    assert host.executor("here", {"workers": 2, "address": None}).name == "here"
    with pytest.raises(UsageError, match=r"^--address x: the here executor does not read it \(it reads: "
                                         r"--workers\); leave it out, or choose another --executor$"):
        host.executor("here", {"address": "x"})
    assert host.executor("anything", {"address": "x"}).name == "anything"  # (options not declared: all taken)


def test_validate_checks_the_manifests_wire_bytes(host, capsys, tmp_path):
    out = tmp_path / "set"
    assert run(host, capsys, "generate", "--model", "toy", "--dp", "4", "--format", "jsonl", "-o", str(out))[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rank_classes"][0]["wire_bytes"]["all_reduce"] == 3 * GRAD_BYTES // 2
    manifest["rank_classes"][0]["wire_bytes"]["all_reduce"] = GRAD_BYTES  # (the input size, taken for the wire)
    (out / "manifest.json").write_text(json.dumps(manifest))
    status, _, err = run(host, capsys, "validate", str(out))
    assert status == 1 and f"its nodes put {3 * GRAD_BYTES // 2:,} bytes on the wire by all_reduce" in err
    del manifest["rank_classes"][0]["wire_bytes"]  # (a manifest an older STAGE wrote: nothing to compare)
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert run(host, capsys, "validate", str(out))[0] == 0
