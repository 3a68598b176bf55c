"""validate cannot be fooled (issue 9, point 3): it reads the manifest and recomputes its
numbers from the files, sees duplicate ids whatever objects the reader shares, and each
rank's last nodes.  Every case of the issue, on a set of the toy model (jsonl backend)."""

import json

import pytest

from stage_core import hookimpl
from stage_core.flow import plan_job, read_trace_set, write_trace_set
from stage_core.parallel import R
from stage_core.parallel.plan import Plan
from stage_core.records import StrategySpec
from stage_core.testing import fresh_host, jsonl_plugin, toy_plugin
from stage_core.trace import TraceSet
from stage_core.validate import validate


def _dp(sg, mesh, plan):
    sg.shard_inputs("dp", "b")
    sg.grad_target["dp"] = R
    return sg


class DP:
    @hookimpl
    def stage_strategies(self):
        return [StrategySpec("dp", "dp", lambda g, p: [], _dp)]


@pytest.fixture(scope="module")
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (DP(), "dp"))


@pytest.fixture(params=[1, 2], ids=["one-rank-class", "two-rank-class"])
def written(request, host, tmp_path):
    out = tmp_path / "set"
    write_trace_set(host, plan_job(host, "toy", {}, Plan(dp=request.param)), out, "jsonl")
    return out


def problems(host, folder):
    return [str(p) for p in validate(read_trace_set(host, folder))]


def lines(folder, rank=0):
    return (folder / f"trace.{rank}.jsonl").read_text().splitlines()


def rewrite(folder, nodes, rank=0):
    (folder / f"trace.{rank}.jsonl").write_text("".join(json.dumps(n) + "\n" for n in nodes))


def edit_node(folder, change, rank=0, index=-1, where=None):
    nodes = [json.loads(line) for line in lines(folder, rank)]
    if where is not None:
        index = next(i for i, n in enumerate(nodes) if where(n))
    change(nodes[index])
    rewrite(folder, nodes, rank)


def edit_manifest(folder, change):
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_written_set_passes_and_its_manifest_holds_what_the_files_add_up_to(host, written):
    assert problems(host, written) == []
    manifest = json.loads((written / "manifest.json").read_text())
    rc = manifest["rank_classes"][0]
    nodes = [json.loads(line) for line in lines(written)]
    assert rc["nodes"] == len(nodes)
    assert rc["comm_bytes"]["all_reduce"] == sum(n["attrs"]["comm_size"][1] for n in nodes if n["type"] == 7)
    comp = [n for n in nodes if n["type"] == 4]
    zero_flop = sum(n["attrs"]["num_ops"][1] == 1 for n in comp)  # written as 1 op
    assert rc["flops"]["total"] == sum(n["attrs"]["num_ops"][1] for n in comp) - zero_flop
    assert len(rc["program_sha256"]) == 64


def test_the_last_node_dropped(host, written):
    rewrite(written, [json.loads(line) for line in lines(written)][:-1])
    found = problems(host, written)
    assert any("rank 0: " in p and "nodes, but manifest.json rank class 0 says" in p
               and "its last nodes are missing" in p for p in found), found


def test_a_duplicate_id_of_the_very_same_object(host, written):
    # a byte-identical duplicated record: a reader that shares equal records hands out
    # the same object twice
    trace_set = read_trace_set(host, written)
    inner = trace_set.iter_ranks

    def iter_ranks():
        for rank, nodes in inner():
            yield rank, (nodes + [nodes[-1]] if rank == 0 else nodes)

    shared = TraceSet(trace_set.world_size, trace_set.comm_groups, iter_ranks, trace_set.metadata)
    found = [str(p) for p in validate(shared)]
    last = json.loads(lines(written)[-1])
    assert any(f"duplicate node id {last['id']}" in p and "the same record twice" in p for p in found), found


@pytest.mark.parametrize("field,change,needle", [
    ("num_ops", lambda n: n["attrs"]["num_ops"].__setitem__(1, n["attrs"]["num_ops"][1] ^ 4), "FLOPs (num_ops)"),
    ("tensor_size", lambda n: n["attrs"]["tensor_size"].__setitem__(1, n["attrs"]["tensor_size"][1] ^ 8),
     "bytes (tensor_size)"),
    ("is_cpu_op", lambda n: n["attrs"]["is_cpu_op"].__setitem__(1, True), "is_cpu_op true"),
    ("kind", lambda n: n["attrs"]["tensor_size"].__setitem__(0, "int64_val"), "program_sha256 differs"),
    ("name", lambda n: n.__setitem__("name", n["name"] + "x"), "program_sha256 differs"),
    ("dependency", lambda n: n.__setitem__("data_deps", [d - 1 for d in n["data_deps"]]), "program_sha256"),
    ("duration", lambda n: n.__setitem__("duration_micros", 7), "program_sha256 differs"),
])
def test_a_changed_field_of_a_compute_node(host, written, field, change, needle):
    edit_node(written, change, where=lambda n: n["type"] == 4 and n["data_deps"] and n["attrs"]["num_ops"][1] > 8)
    found = problems(host, written)
    assert any(p.startswith("rank 0: ") and needle in p for p in found), found


def test_a_changed_collective_size(host, tmp_path):
    written = tmp_path / "set"
    write_trace_set(host, plan_job(host, "toy", {}, Plan(dp=2)), written, "jsonl")
    edit_node(written, lambda n: n["attrs"]["comm_size"].__setitem__(1, n["attrs"]["comm_size"][1] + 2),
              where=lambda n: n["type"] == 7)
    found = problems(host, written)
    assert any(p.startswith("rank 0: its nodes move") and "by all_reduce, but manifest.json rank class 0 says" in p
               for p in found), found
    assert any(p.startswith("rank 0: its nodes add up to other costs than those of rank 1") for p in found), found


@pytest.mark.parametrize("change,needle", [
    (lambda m: m.__setitem__("world_size", m["world_size"] + 1), "manifest.json: world_size"),
    (lambda m: m["rank_classes"][0]["ranks"].pop(), "lists this rank in no rank class"),
    (lambda m: m["rank_classes"].append(dict(m["rank_classes"][0])), "in rank classes 0 and 1"),
    (lambda m: m["rank_classes"][0]["flops"].__setitem__("total", m["rank_classes"][0]["flops"]["total"] + 1),
     "is not matmul"),
    (lambda m: [m["rank_classes"][0]["flops"].__setitem__(k, m["rank_classes"][0]["flops"][k] + 10**6)
                for k in ("other", "total")], "FLOPs (num_ops), but manifest.json rank class 0 says flops total"),
    (lambda m: m["rank_classes"][0]["comm_bytes"].__setitem__("all_gather", 8), "by all_gather"),
    (lambda m: m["rank_classes"][0].__setitem__("kernel_bytes", m["rank_classes"][0]["kernel_bytes"] + 10**6),
     "says kernel_bytes"),
    (lambda m: m["rank_classes"][0].__setitem__("nodes", m["rank_classes"][0]["nodes"] + 1), "says"),
    (lambda m: m["rank_classes"][0].__setitem__("program_sha256", "0" * 64), "program_sha256 differs"),
    (lambda m: m["rank_classes"][0].__setitem__("compute_time_us", 5), "says compute_time_us 5"),
    (lambda m: m.__setitem__("rank_classes", {}), "rank_classes is not a list of objects"),
    (lambda m: m["rank_classes"][0].__setitem__("flops", None), "flops must hold integers"),
])
def test_every_edit_of_the_manifest(host, written, change, needle):
    edit_manifest(written, change)
    found = problems(host, written)
    assert any(needle in p for p in found), found


def test_a_rank_whose_program_differs_from_its_class_mates(host, tmp_path):
    out = tmp_path / "set"
    write_trace_set(host, plan_job(host, "toy", {}, Plan(dp=4)), out, "jsonl")
    edit_node(out, lambda n: n.__setitem__("name", "renamed"), rank=2, index=3)
    edit_node(out, lambda n: n["attrs"]["tensor_size"].__setitem__(1, n["attrs"]["tensor_size"][1] + 1), rank=3,
              where=lambda n: n["type"] == 4)
    found = problems(host, out)
    assert "rank 2: its nodes are not the program manifest.json rank class 0 was written with (program_sha256 " \
           "differs): a node's id, name, type, dependencies or costs changed" in found, found
    assert any(p.startswith("rank 3: its nodes add up to other costs than those of rank 0 and 2 more of its rank "
                            "class (tensor_size") for p in found), found
    assert not any(p.startswith(("rank 0:", "rank 1:")) for p in found), found
