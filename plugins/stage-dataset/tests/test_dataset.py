"""stage dataset: graphs of rank programs, their features, labels, splits and cache."""

import csv
import json

import numpy as np
import pytest

import layerdag
from stage_core.api import Plan, UsageError, main, plan_job
from stage_dataset import files
from stage_dataset.dataset import build, split_plans
from stage_dataset.graphs import FEATURES, program_graphs
from support import H100, serial

GRID = """
measure = "estimate"
[base]
model = "toy"
[grid]
seq-len = [32, 64]
dp = [1, 2]
pp = [1, 2]
micro-batches = [2, 4]
"""


def toy_params(h=64, f=256, V=128, layers=2) -> int:
    """The toy model's parameters by hand: per layer two layer norms (2h each), qkv (h·3h + 3h),
    the output projection (h·h + h), the MLP (h·f + f, f·h + h); the tied embedding V·h and
    the final norm 2h."""
    return layers * (2 * 2 * h + h * 3 * h + 3 * h + h * h + h + h * f + f + f * h + h) + V * h + 2 * h


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def dataset(path):
    return {s: dict(np.load(path / f"{s}.npz")) for s in files.SPLITS}


def test_a_layer_of_the_toy_model_is_its_dataflow(host):
    """Layer 0's forward of the toy (build_toy): ln1, qkv, scores, softmax, dropout, context,
    out, residual, ln2, fc1, gelu, fc2, residual: 13 kernels; 14 edges (the context reads qkv
    and the dropout, each residual its two inputs, one of which comes from outside the layer)."""
    result = plan_job(host, "toy", {}, Plan(), H100)
    graphs = program_graphs(result.job, "layer", 400)
    i = graphs.key.index("mb0.fwd/layers.0")
    assert (graphs.num_nodes[i], graphs.num_edges[i]) == (13, 14)
    names = [graphs.categories[c] for c in graphs.x_n[i]]
    assert names[:3] == ["norm:layernorm/forward", "einsum/forward", "einsum/forward"]
    # qkv: 2·b·s·h·3h FLOPs and its bias b·s·3h (b 1, s 32, h 64)
    assert graphs.x_f[i][1].tolist() == [2 * 32 * 64 * 192 + 32 * 192, 41344, 0, 1]
    # a step of one micro-batch on one GPU: forward and backward by layer and the rest, the optimizer
    assert graphs.key == ["mb0.fwd/other", "mb0.fwd/layers.0", "mb0.fwd/layers.1", "mb0.bwd/other",
                          "mb0.bwd/layers.1", "mb0.bwd/layers.0", "tail/other"]
    assert sum(graphs.num_nodes) == len(result.job.programs[0].nodes)


def test_segments_are_the_schedules_steps_and_the_tail_reduces_every_gradient(host):
    """1F1B over 2 stages and 4 micro-batches: each stage runs 4 forwards and 4 backwards, then its
    gradient reduction and optimizer: 9 graphs per stage.  Over dp 2 the tails all-reduce 2 bytes
    per parameter of their stage (bf16 gradients, REFERENCE.md 3), the last stage holding a copy
    of the tied embedding (V·h), and the two stages sum that embedding's gradient once more
    between them (Megatron's tied-embedding all-reduce, 2·V·h bytes on each)."""
    result = plan_job(host, "toy", {}, Plan(pp=2, dp=2, micro_batches=4), H100)
    graphs = program_graphs(result.job, "segment", 400)
    for c in (0, 1):
        keys = [k for k, rc in zip(graphs.key, graphs.rank_class) if rc == c]
        assert sorted(keys) == sorted([f"mb{m}.chunk{c}.{p}" for m in range(4) for p in ("fwd", "bwd")] + ["tail"])
    ar = graphs.categories.index("all_reduce")
    reduced = 0
    for k, x_n, x_f in zip(graphs.key, graphs.x_n, graphs.x_f):
        if k == "tail":
            mine = x_n == ar
            assert (x_f[mine, FEATURES.index("group_size")] == 2).all()
            reduced += int(x_f[mine, FEATURES.index("message_bytes")].sum())
    assert reduced == 2 * (toy_params() + 128 * 64) + 2 * (2 * 128 * 64)
    whole = program_graphs(result.job, "step", 10**6)
    assert whole.num_nodes == [len(p.nodes) for p in result.job.programs]
    assert program_graphs(result.job, "step", 10).too_large == 2


def test_the_dataset_reads_as_layerdags_loader_expects_and_its_labels_are_the_estimators(host, tmp_path):
    (tmp_path / "grid.toml").write_text(GRID)
    out = tmp_path / "ds"
    assert build(tmp_path / "grid.toml", out, executor="in-order", estimator="serial", cache=tmp_path / "c",
                 node_times=True) == 0
    data = dataset(out)
    k = layerdag.check(data["train"], data["val"], data["test"])
    cats = json.loads((out / "categories.json").read_text())
    assert cats["num_categories"] == k == len(cats["categories"]) and cats["features"] == list(FEATURES)
    rows = read_csv(out / "index.csv")
    summary = json.loads((out / "summary.json").read_text())
    # 16 plans; a stage runs m forwards, m backwards and a tail: 2m + 1 graphs, twice with pp 2;
    # per (seq-len, dp): m 2 gives 5 + 10, m 4 gives 9 + 18
    assert summary["points"] == 16 and summary["points_ok"] == 16
    assert sum(summary["graphs"].values()) == 4 * (5 + 10 + 9 + 18)
    assert len(rows) == sum(summary["graphs"].values()) == sum(len(d["num_nodes"]) for d in data.values())
    for s in files.SPLITS:
        mine = [r for r in rows if r["split"] == s]
        assert [int(r["graph"]) for r in mine] == list(range(len(mine)))
        assert [int(r["num_nodes"]) for r in mine] == data[s]["num_nodes"].tolist()
        assert [float(r["y"]) for r in mine] == data[s]["y"].tolist()
    # every graph's y is its plan's step, as the estimator gives it for the same flags
    for r in rows[:: max(1, len(rows) // 12)]:
        plan = Plan(dp=int(r["dp"]), pp=int(r["pp"]), micro_batches=int(r["micro-batches"]), seq_len=int(r["seq-len"]))
        assert float(r["y"]) == serial(plan_job(host, "toy", {}, plan, H100), H100)["step_time_s"]
    # a graph's span is its last finish less its first start, in the estimator's node times
    s = data["train"]
    first = s["node_start"][: s["num_nodes"][0]]
    last = s["node_finish"][: s["num_nodes"][0]]
    assert s["graph_time"][0] == last.max() - first.min()


def test_no_plan_is_in_two_splits_and_the_seed_decides(host, tmp_path):
    (tmp_path / "grid.toml").write_text(GRID.replace("[grid]", "[grid]\nsystem = ['h100', 'h100']"))
    build(tmp_path / "grid.toml", tmp_path / "a", executor="in-order", estimator="serial", cache=tmp_path / "c",
          split="0.5,0.25,0.25")
    rows = read_csv(tmp_path / "a" / "index.csv")
    plan = ("seq-len", "dp", "pp", "micro-batches")
    splits = {}
    for r in rows:
        splits.setdefault(tuple(r[k] for k in plan), set()).add(r["split"])
    assert all(len(v) == 1 for v in splits.values()) and len(splits) == 16
    assert sorted(sum((list(v) for v in splits.values()), [])).count("train") == 8  # half of 16 plans
    keys = [f"p{i}" for i in range(16)]
    assert split_plans(keys, (0.5, 0.25, 0.25), 0) == split_plans(keys, (0.5, 0.25, 0.25), 0)
    assert split_plans(keys, (0.5, 0.25, 0.25), 0) != split_plans(keys, (0.5, 0.25, 0.25), 1)
    assert split_plans(["a", "b", "a"], (1.0, 0.0, 0.0), 3) == ["train", "train", "train"]


def test_a_rerun_takes_every_point_from_the_cache_and_writes_the_same_files(host, tmp_path, capsys):
    (tmp_path / "grid.toml").write_text(GRID)
    kw = dict(executor="in-order", estimator="serial", cache=tmp_path / "c")
    build(tmp_path / "grid.toml", tmp_path / "a", **kw)
    assert "16 points: 0 cached, 16 to evaluate" in capsys.readouterr().err
    build(tmp_path / "grid.toml", tmp_path / "b", **kw)
    assert "16 points: 16 cached, 0 to evaluate" in capsys.readouterr().err
    for name in ("index.csv", "categories.json"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    a, b = dataset(tmp_path / "a"), dataset(tmp_path / "b")
    # each graph's span, from the estimator's node times, whether or not they are kept per node
    assert np.isfinite(a["train"]["graph_time"]).all() and "node_start" not in a["train"]
    assert all((a[s][k] == b[s][k]).all() or np.isnan(a[s][k]).all() for s in a for k in a[s])
    build(tmp_path / "grid.toml", tmp_path / "c2", granularity="layer", **kw)  # another unit: evaluated anew
    assert "16 points: 0 cached, 16 to evaluate" in capsys.readouterr().err
    build(tmp_path / "grid.toml", tmp_path / "b", fresh=True, **kw)  # -o over a dataset replaces it
    assert "0 cached, 16 to evaluate" in capsys.readouterr().err


def test_plans_the_core_refuses_are_counted_not_fatal(host, tmp_path, capsys):
    (tmp_path / "grid.toml").write_text('[base]\nmodel = "toy"\n[grid]\ntp = [1, 2]\n')
    build(tmp_path / "grid.toml", tmp_path / "ds", executor="in-order", estimator="serial", cache=tmp_path / "c")
    summary = json.loads((tmp_path / "ds" / "summary.json").read_text())
    assert (summary["points_ok"], summary["points_invalid"]) == (1, 1)  # no tp strategy is installed here
    assert "from 1 plans (1 invalid)" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--split", "0.9,0.2,0"], "--split 0.9,0.2,0: give three shares"),
    (["--max-nodes", "0"], "--max-nodes 0: must be 1 or more"),
    (["--estimator", "guess"], "--estimator guess: unknown estimator; known: serial"),
    (["--executor", "slurm"], "--executor slurm: unknown executor; known: in-order"),
    (["--granularity", "op"], "argument --granularity: invalid choice: 'op'"),
])
def test_bad_options_are_one_line_and_nothing_is_written(host, tmp_path, capsys, args, message):
    (tmp_path / "grid.toml").write_text(GRID)
    status = main(["dataset", str(tmp_path / "grid.toml"), "-o", str(tmp_path / "ds"), "--executor", "in-order",
                   "--estimator", "serial", "--cache", str(tmp_path / "c"), *args], host=host)
    err = capsys.readouterr().err
    assert status == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "ds").exists()


def test_an_output_folder_with_other_files_is_left_alone(host, tmp_path):
    (tmp_path / "grid.toml").write_text(GRID)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=r"-o .*ds: holds files that are not a dataset's \(notes.txt\)"):
        build(tmp_path / "grid.toml", tmp_path / "ds", executor="in-order", estimator="serial")
    assert (tmp_path / "ds" / "notes.txt").read_text() == "mine"


def test_node_times_need_an_estimator_and_pth_needs_torch(host, tmp_path, monkeypatch):
    (tmp_path / "grid.toml").write_text(GRID.replace('"estimate"', '"simulate"'))
    with pytest.raises(UsageError, match="--node-times: a simulator's run gives no node times"):
        build(tmp_path / "grid.toml", tmp_path / "ds", executor="in-order", node_times=True)
    import builtins

    real = builtins.__import__

    def no_torch(name, *a, **kw):
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(UsageError, match=r"--pth: LayerDAG's .pth files need torch.*pip install 'stage-dataset\[torch\]'"):
        build(tmp_path / "grid.toml", tmp_path / "ds", executor="in-order", pth=True)


def test_a_simulate_grid_without_a_simulator_says_so(host, tmp_path, capsys):
    (tmp_path / "grid.toml").write_text(GRID.replace('"estimate"', '"simulate"'))
    build(tmp_path / "grid.toml", tmp_path / "ds", executor="in-order", cache=tmp_path / "c")
    summary = json.loads((tmp_path / "ds" / "summary.json").read_text())
    assert summary["points_not_simulated"] == 16 and sum(summary["graphs"].values()) == 0
    assert "16 not simulated" in capsys.readouterr().err


def test_the_pth_form_holds_the_same_graphs_where_torch_is_installed(host, tmp_path):
    torch = pytest.importorskip("torch", reason="torch is the plugin's optional `torch` extra")
    (tmp_path / "grid.toml").write_text(GRID)
    build(tmp_path / "grid.toml", tmp_path / "ds", executor="in-order", estimator="serial", cache=tmp_path / "c",
          pth=True)
    for s in files.SPLITS:
        got = torch.load(tmp_path / "ds" / f"{s}.pth")
        want = layerdag.lists(dict(np.load(tmp_path / "ds" / f"{s}.npz")))
        assert got["y_list"] == want["y_list"]
        for key in ("src_list", "dst_list", "x_n_list"):
            assert [t.dtype for t in got[key]] == [torch.int64] * len(want[key])
            assert [t.numpy().tolist() for t in got[key]] == [a.tolist() for a in want[key]]
