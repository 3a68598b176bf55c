"""stage from-dag: a DAG (JSON, a dataset's graph, LayerDAG's .pth) as a validated trace set."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from stage_core.api import UsageError, main, read_trace_set
from stage_core.testing import check_trace_set
from stage_dataset import dag as dag_mod
from stage_dataset.dataset import build

DATA = Path(__file__).parent / "data"
GEMM = 2 * 4096 ** 3  # the default kernel: a 4096-cube GEMM, 2 FLOPs per multiply-add


def from_dag(host, *args):
    return main(["from-dag", *map(str, args), "--format", "jsonl"], host=host)


def rank_nodes(host, directory):
    return dict(read_trace_set(host, Path(directory)).iter_ranks())


def test_a_hand_written_dag_runs_on_the_ranks_its_groups_and_messages_need(host, tmp_path, capsys):
    """synthetic.json: an all-reduce over 4 ranks, an all-gather over 2, and messages (a ring of 2):
    4 x 2 x 2 = 16 ranks; groups 16/4 + 16/2 + 16/2 = 20; per rank its 8 nodes, a send feeding its
    receive and a receive draining its send."""
    assert from_dag(host, DATA / "synthetic.json", "-o", tmp_path / "set") == 0
    assert "8 nodes as 10 per rank on 16 ranks" in capsys.readouterr().out
    check_trace_set(host, tmp_path / "set")  # the kit: every check and the replay pass
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    groups = json.loads((tmp_path / "set" / "comm_groups.json").read_text())
    assert manifest["world_size"] == 16 and len(groups) == 20
    assert sorted(len(m) for m in groups.values()) == [2] * 16 + [4] * 4
    rc = manifest["rank_classes"][0]
    # qkv as given, the flash attention and the MLP at the default GEMM, the add as given
    assert rc["flops"]["total"] == 68719476736 + GEMM + GEMM + 4194304
    assert rc["comm_bytes"] == {"all_reduce": 8388608, "all_gather": 4194304, "reduce_scatter": 0,
                                "all_to_all": 0, "send": 2 * 8388608, "recv": 2 * 8388608}
    ranks = rank_nodes(host, tmp_path / "set")
    nodes = ranks[5]
    assert [n.name for n in nodes] == ["feed.0:send", "dag.0:recv", "dag.1:einsum/forward",
                                       "dag.2:fused:flash_attention/forward", "dag.3:einsum/forward",
                                       "dag.4:all_reduce", "dag.5:all_gather", "dag.6:compute", "dag.7:send",
                                       "drain.7:recv"]
    # sends and collectives chained in order (each waits on the one before), so members agree
    chain = [n for n in nodes if n.type in (5, 7)]
    for before, after in zip(chain, chain[1:]):
        assert before.id in after.ctrl_deps or before.id in after.data_deps
    # rank 5 is at (1, 1, 0) on axes (4, 2, 2), strides (1, 4, 8): its ring neighbour on the
    # message axis is 5 + 8 = 13, and its groups are [4, 5, 6, 7] (size 4) and [1, 5] (size 2)
    send = nodes[8]
    assert send.attr("comm_dst") == 13 and nodes[1].attr("comm_src") == 13
    assert nodes[5].attr("pg_name") == next(k for k, m in groups.items() if m == [4, 5, 6, 7])
    assert nodes[6].attr("pg_name") == next(k for k, m in groups.items() if m == [1, 5])


def test_kernels_are_timed_on_a_gpu_when_asked(host, tmp_path):
    """On the h100's roofline a 4096-cube GEMM takes 2·4096³ / 989.4e12 s = 138.9 us (REFERENCE.md 7)."""
    dag = tmp_path / "one.json"
    dag.write_text(json.dumps({"nodes": [{"type": "einsum/forward"}, {"type": "all_reduce"}],
                               "edges": [[0, 1]]}))
    assert from_dag(host, dag, "-o", tmp_path / "set", "--gpu", "h100") == 0
    nodes = rank_nodes(host, tmp_path / "set")[1]
    assert nodes[0].duration_micros == round(GEMM / 989.4e12 * 1e6) == 139
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["rank_classes"][0]["compute_time_us"] == 139


def test_a_dataset_graph_becomes_a_set_with_its_own_sizes(host, tmp_path):
    (tmp_path / "grid.toml").write_text('[base]\nmodel = "toy"\n[grid]\npp = [2]\ndp = [2]\nmicro-batches = [2]\n')
    build(tmp_path / "grid.toml", tmp_path / "ds", executor="in-order", estimator="serial", cache=tmp_path / "c")
    split = dict(np.load(tmp_path / "ds" / "train.npz"))
    at = np.concatenate([[0], np.cumsum(split["num_nodes"])])
    for g in range(len(split["num_nodes"])):
        out = tmp_path / f"set{g}"
        assert from_dag(host, tmp_path / "ds" / "train.npz", "--graph", g, "-o", out) == 0
        check_trace_set(host, out)
        feats = split["x_f"][at[g]:at[g + 1]]
        rc = json.loads((out / "manifest.json").read_text())["rank_classes"][0]
        compute = feats[:, 3] == 1
        # a kernel without arithmetic (the embedding gather) is written with num_ops 1, as in STAGE's sets
        assert rc["flops"]["total"] == int(np.maximum(feats[compute, 0], 1).sum())
        assert rc["kernel_bytes"] == int(feats[compute, 1].sum())
    assert g + 1 == len(split["num_nodes"]) > 0
    # sized by each category's medians instead of the graph's own features
    assert from_dag(host, tmp_path / "ds" / "train.npz", "--graph", 0, "-o", tmp_path / "d", "--defaults") == 0
    cats = {c["id"]: c for c in json.loads((tmp_path / "ds" / "categories.json").read_text())["categories"]}
    x_n = split["x_n"][: split["num_nodes"][0]]
    want = sum(max(1, cats[c]["defaults"]["flops"]) for c in x_n.tolist() if cats[c]["kind"] == "compute")
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["rank_classes"][0]["flops"]["total"] == want


def dag_file(tmp_path, nodes, edges, name="g.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"nodes": nodes, "edges": edges}))
    return path


@pytest.mark.parametrize("nodes,edges,extra,message", [
    ([{"type": "compute"}, {"type": "compute"}], [[0, 1], [1, 0]], [], "not a DAG: node 0 is on a cycle"),
    ([{"type": "allreduce"}], [], [], "type 'allreduce': valid types are compute"),
    ([{"type": "all_reduce", "group_size": 1}], [], [], "a all_reduce over 1 rank(s); a collective needs 2 or more"),
    ([{"type": "compute", "flops": -1}], [], [], "flops -1: give a whole number, 0 or more"),
    ([{"type": "compute", "colour": 1}], [], [], "unknown key 'colour'"),
    ([{"type": "compute"}], [[0, 3]], [], "edge [0, 3]: no node 3"),
    ([{"type": "all_reduce"}], [], ["--ranks", "3"], "--ranks 3: must be a multiple of 2"),
    ([{"type": "compute"}], [], ["--graph", "1"], "--graph 1: a JSON file holds one DAG"),
])
def test_a_bad_dag_is_one_line_and_writes_nothing(host, tmp_path, capsys, nodes, edges, extra, message):
    path = dag_file(tmp_path, nodes, edges)
    assert from_dag(host, path, "-o", tmp_path / "set", *extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "set").exists()


@pytest.mark.parametrize("text,message", [("[" * 50_000 + "]" * 50_000, "nested too deep"),
                                          ("fifo", "not a regular file but a FIFO"), ("{", "not valid JSON")])
def test_an_unreadable_dag_file_is_one_line_at_once(host, tmp_path, capsys, text, message):
    """A DAG file nested 50,000 deep or a FIFO (which would block a plain read forever)."""
    path = tmp_path / "dag.json"
    if text == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(text)
    assert from_dag(host, path, "-o", tmp_path / "set") == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "set").exists()


def test_a_split_without_its_categories_or_past_its_last_graph_is_refused(host, tmp_path):
    np.savez(tmp_path / "x.npz", num_nodes=[1], num_edges=[0], src=np.zeros(0, int), dst=np.zeros(0, int), x_n=[0])
    with pytest.raises(UsageError, match="its node categories are numbers; give their names with --categories"):
        dag_mod.read(tmp_path / "x.npz", 0, None)
    (tmp_path / "categories.json").write_text(json.dumps({"categories": [{"id": 0, "name": "einsum/forward"}]}))
    with pytest.raises(UsageError, match=r"--graph 4: .*x.npz has 1 graphs \(0..0\)"):
        dag_mod.read(tmp_path / "x.npz", 4, None)
    got = dag_mod.read(tmp_path / "x.npz", 0, None)
    assert got.categories == ["einsum/forward"] and got.features[0].tolist() == [GEMM, 3 * 4096 ** 2 * 2, 0, 1]


def test_layerdags_own_files_are_read_where_torch_is_installed(host, tmp_path):
    torch = pytest.importorskip("torch", reason="torch is the plugin's optional `torch` extra")
    torch.save({"src_list": [torch.tensor([0, 0, 1, 2])], "dst_list": [torch.tensor([1, 2, 3, 3])],
                "x_n_list": [torch.tensor([0, 0, 0, 1])], "y_list": [1.5]}, tmp_path / "gen.pth")
    (tmp_path / "categories.json").write_text(json.dumps({"categories": [
        {"id": 0, "name": "einsum/forward", "kind": "compute"}, {"id": 1, "name": "all_reduce", "kind": "collective"}]}))
    assert from_dag(host, tmp_path / "gen.pth", "-o", tmp_path / "set") == 0
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["rank_classes"][0]["flops"]["total"] == 3 * GEMM
