"""The issue's sets that passed `stage validate` (issue 9, point 3), as Chakra ET files:
each is now refused, exit 1, naming what is wrong."""

import json
import shutil

import pytest
from stage_adapter_chakra import schema, wire


@pytest.fixture(scope="module")
def good(tmp_path_factory, host):
    from stage_core.flow import plan_job, write_trace_set
    from stage_core.parallel.plan import Plan

    out = tmp_path_factory.mktemp("fooled") / "set"
    write_trace_set(host, plan_job(host, "gpt-tiny", {}, Plan(pp=2, dp=2, micro_batches=2)), out)
    return out


@pytest.fixture
def copy(good, tmp_path):
    out = tmp_path / "set"
    shutil.copytree(good, out)
    return out


def frames(path):
    data = path.read_bytes()
    _, starts = wire.split_frames(data)
    return data, list(zip(starts, starts[1:]))


def edit_record(path, index, change):
    """Decode record ``index`` of a trace file (0: the metadata), change it, write it back."""
    data, bounds = frames(path)
    start, end = bounds[index]
    node = schema.Node.FromString(wire.read_frame(data, start)[0])
    change(node)
    path.write_bytes(data[:start] + wire.frame(node.SerializeToString()) + data[end:])


def attr(node, name):
    return next(a for a in node.attr if a.name == name)


def refused(run_stage, folder, *needles):
    done = run_stage("validate", folder)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr
    return done.stderr


def test_a_byte_identical_duplicated_record(run_stage, copy):
    data, bounds = frames(copy / "trace.1.et")
    start, end = bounds[5]
    (copy / "trace.1.et").write_bytes(data[:end] + data[start:end] + data[end:])
    refused(run_stage, copy, "rank 1, node", "duplicate node id", "the same record twice")


def test_a_dropped_last_node(run_stage, copy):
    data, bounds = frames(copy / "trace.3.et")
    (copy / "trace.3.et").write_bytes(data[:bounds[-1][0]])
    refused(run_stage, copy, "rank 3: ", "its last nodes are missing")


def test_a_missing_last_rank_file_is_named(run_stage, copy):
    (copy / "trace.3.et").unlink()
    refused(run_stage, copy, "trace.3.et missing (the manifest's world size is 4)")


@pytest.mark.parametrize("name,change,needle", [
    ("num_ops", lambda a: setattr(a, "int64_val", a.int64_val ^ 64), "FLOPs (num_ops)"),
    ("tensor_size", lambda a: setattr(a, "uint64_val", a.uint64_val ^ 64), "bytes (tensor_size)"),
    ("is_cpu_op", lambda a: setattr(a, "bool_val", True), "is_cpu_op true"),
])
def test_a_flipped_cost_or_flag(run_stage, copy, name, change, needle):
    def flip(node):
        change(attr(node, name))

    edit_record(copy / "trace.2.et", 3, flip)  # a compute node (a stage's first is its receive)
    refused(run_stage, copy, "rank 2: ", needle)


@pytest.mark.parametrize("key,change", [
    ("the manifest's world size is 5", lambda m: m.__setitem__("world_size", 5)),
    ("in no rank class", lambda m: m["rank_classes"][1]["ranks"].pop()),
    ("is not matmul 1", lambda m: m["rank_classes"][0]["flops"].__setitem__("matmul", 1)),
    ("by send, but manifest.json rank class 1 says 0", lambda m: m["rank_classes"][1]["comm_bytes"].__setitem__("send", 0)),
])
def test_an_edited_manifest(run_stage, copy, key, change):
    manifest = json.loads((copy / "manifest.json").read_text())
    change(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    done = run_stage("validate", copy)
    assert done.returncode == 1 and key in done.stderr and "Traceback" not in done.stderr, done.stderr
