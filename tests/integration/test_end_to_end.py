"""The whole flow as a user runs it: installed plugins, the `stage` command, real files."""

import csv
import json
import re
from pathlib import Path

import pytest

from stage_core.trace import CollectiveType, NodeType


def decode(directory):
    """Decode with the Chakra adapter's protobuf reader (field-for-field et_def.proto)."""
    from stage_adapter_chakra import etread

    ts = etread.read(directory)
    return ts, dict(ts.iter_ranks())


def test_gpt_tiny_on_four_data_parallel_ranks(run_stage, tmp_path):
    out = tmp_path / "out"
    done = run_stage("generate", "--model", "gpt-tiny", "--dp", "4", "-o", out)
    assert done.returncode == 0, done.stderr
    ts, ranks = decode(out)
    assert ts.world_size == 4 and sorted(ranks) == [0, 1, 2, 3]
    manifest = json.loads((out / "manifest.json").read_text())
    report = json.loads(run_stage("report", "--model", "gpt-tiny", "--json").stdout)
    params = report["rank_classes"][0]["memory_bytes"]["parameters"] // 2  # bf16
    for rank, nodes in ranks.items():
        colls = [n for n in nodes if n.type == NodeType.COMM_COLL]
        assert {n.attr("comm_type") for n in colls} == {CollectiveType.ALL_REDUCE}
        assert {n.attr("pg_name") for n in colls} == {"1"}
        # one all-reduce of every bf16 gradient per step (REFERENCE §3)
        assert sum(n.attr("comm_size") for n in colls) == 2 * params
        comp = [n for n in nodes if n.type == NodeType.COMP]
        assert all(n.attrs["num_ops"][0] == "int64_val" and n.attr("num_ops") > 0 for n in comp)
        assert all(n.attrs["tensor_size"][1] > 0 for n in comp)
    assert ts.comm_groups == {"1": [0, 1, 2, 3]}
    assert manifest["units"] == {"compute": "FLOPs", "sizes": "bytes"}
    assert manifest["world_size"] == 4


def test_default_job_needs_no_arguments(run_stage, tmp_path):
    done = run_stage("generate", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "gpt-tiny" in done.stdout
    ts, ranks = decode(tmp_path / "traces")
    assert ts.world_size == 8 and len(ranks) == 8
    assert run_stage("validate", tmp_path / "traces").returncode == 0


@pytest.mark.parametrize("args,needle", [
    (["--model", "gpt-nope"], "unknown model"),
    (["--model", "gpt-tiny", "--dp", "0"], "--dp 0"),
    (["--model", "gpt-tiny", "--tp", "-2"], "--tp -2"),
    (["--model", "gpt-tiny", "--dp", "3", "--global-batch", "8"], "--dp 3"),
])
def test_bad_input_one_line_exit_2_nothing_written(run_stage, tmp_path, args, needle):
    done = run_stage("generate", *args, "-o", tmp_path / "out")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and needle in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output(run_stage, tmp_path):
    (tmp_path / "file").write_text("x")
    done = run_stage("generate", "--model", "gpt-tiny", "-o", tmp_path / "file" / "out")
    assert done.returncode == 2 and "not a folder" in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


ROOT = Path(__file__).resolve().parents[2]


def test_quick_start_has_two_commands_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 2
    assert "stage generate" in lines[0] and "tox" in lines[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert lines[1] in ci


def _using_it_lines():
    section = (ROOT / "README.md").read_text().split("## Using it", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return block.replace("\\\n", " ").splitlines()


def test_the_readme_s_input_files_are_in_the_repository():
    # every file a "Using it" line reads (a config.json, a table, the example grid) ships with the clone,
    # so a new user runs the lines as written; outputs (-o) are not inputs
    inputs = []
    for line in _using_it_lines():
        words = line.split("#", 1)[0].split()
        for before, word in zip(["", *words], words):
            if before in ("-o", "--output", "--plot") or "/" not in word:
                continue
            if re.search(r"\.(json|csv|toml)$", word):
                inputs.append(word)
    assert "examples/grid.toml" in inputs and len(inputs) >= 5, inputs
    missing = [w for w in inputs if not (ROOT / w).is_file()]
    assert not missing, missing


def test_the_example_grid_sweeps_twelve_plans(run_stage, tmp_path):
    # examples/grid.toml: tp [1, 2, 4] x dp [2, 4] x zero [0, 1] = 12 points by hand, every one a valid plan
    out = tmp_path / "sweep.csv"
    done = run_stage("sweep", ROOT / "examples" / "grid.toml", "-o", out, "--quiet", "--cache", tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 12 and {r["status"] for r in rows} == {"ok"}
    assert sorted((int(r["tp"]), int(r["dp"]), int(r["zero"])) for r in rows) == [
        (tp, dp, zero) for tp in (1, 2, 4) for dp in (2, 4) for zero in (0, 1)]
    assert {int(r["world_size"]) for r in rows} == {2, 4, 8, 16}
