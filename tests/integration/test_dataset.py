"""stage dataset and stage from-dag with every plugin installed: three model families'
plans as graphs labelled with `stage estimate`'s step, read as LayerDAG's loader reads
them; their graphs and a hand-written DAG as trace sets that finish on every rank in the
real ASTRA-sim."""

import csv
import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_TESTS = ROOT / "plugins" / "stage-dataset" / "tests"
sys.path.insert(0, str(PLUGIN_TESTS))

import layerdag  # noqa: E402  (the plugin's own reading of LayerDAG's loader contract)

GRID = """
measure = "estimate"
[base]
seq-len = 1024
set = "layers=2"
[[grid]]
model = ["gpt3-175b", "llama3-8b"]
tp = [1, 2]
pp = [1, 2]
dp = [1, 2]
micro-batches = [2]
[[grid]]
model = ["mixtral-8x7b"]
ep = [1, 2]
dp = [2]
pp = [1, 2]
micro-batches = [2]
"""
#: the settings that make a plan, as index.csv spells them (flags of stage estimate)
FLAGS = ("model", "tp", "pp", "dp", "ep", "micro-batches", "seq-len", "set")


def stage_in_process(host, *args) -> tuple[int, str]:
    """``stage ARGS`` in this process (the command line a user types, without starting Python
    again for each): (exit status, what it printed)."""
    from stage_core.api import main

    out = io.StringIO()
    with redirect_stdout(out):
        status = main([str(a) for a in args], host=host)
    return status, out.getvalue()


@pytest.fixture(scope="module")
def data(tmp_path_factory, run_stage):
    where = tmp_path_factory.mktemp("dataset")
    (where / "grid.toml").write_text(GRID)
    done = run_stage("dataset", where / "grid.toml", "-o", where / "ds", "--cache", where / "cache", "--workers", "2",
                     "--split", "0.6,0.2,0.2")
    assert done.returncode == 0, done.stderr
    with open(where / "ds" / "index.csv") as f:
        rows = list(csv.DictReader(f))
    return where / "ds", rows, done.stderr


def test_three_families_read_as_layerdags_loader_expects(data):
    ds, rows, err = data
    splits = {s: dict(np.load(ds / f"{s}.npz")) for s in ("train", "val", "test")}
    k = layerdag.check(splits["train"], splits["val"], splits["test"])
    cats = json.loads((ds / "categories.json").read_text())
    assert k == cats["num_categories"] == len(cats["categories"])
    summary = json.loads((ds / "summary.json").read_text())
    assert summary["points"] == summary["points_ok"] == 2 * 8 + 4
    assert {r["model"] for r in rows} == {"gpt3-175b", "llama3-8b", "mixtral-8x7b"}
    # GPT's GeLU, Llama's SwiGLU and Mixtral's router: each family's own kernels are categories
    names = {c["name"] for c in cats["categories"]}
    assert {"elementwise:bias_gelu/forward", "elementwise:swiglu/forward", "fused:moe_router/forward",
            "all_to_all", "send", "recv", "all_reduce"} <= names
    assert f"wrote {ds}: {len(rows)} graphs" in err


def test_labels_are_stage_estimate_of_their_plans(data, host):
    ds, rows, _ = data
    checked = set()
    for r in rows:
        key = (r["split"], r["model"])
        if key in checked:
            continue
        checked.add(key)
        flags = [x for k in FLAGS if r.get(k) not in (None, "") for x in (f"--{k}", r[k])]
        status, printed = stage_in_process(host, "estimate", *flags, "--gpu", r["hardware"], "--json")
        assert status == 0 and float(r["y"]) == json.loads(printed)["step_time_s"], flags
    assert len(checked) >= 7  # three families over three splits, as the plans fell
    y = dict(np.load(ds / "test.npz"))["y"]
    assert y.tolist() == [float(r["y"]) for r in rows if r["split"] == "test"]


def chosen_graphs(ds, rows):
    """Dataset graphs with each kind of communication: pipeline messages both ways, the data-
    parallel tail, tensor-parallel all-reduces, MoE all-to-alls."""
    cats = {c["id"]: c["name"] for c in json.loads((ds / "categories.json").read_text())["categories"]}
    wanted = {"send": None, "recv": None, "all_to_all": None, "tail": None, "all_reduce": None}
    for split in ("train", "val", "test"):
        d = dict(np.load(ds / f"{split}.npz"))
        at = np.concatenate([[0], np.cumsum(d["num_nodes"])])
        mine = [r for r in rows if r["split"] == split]
        for g, r in enumerate(mine):
            names = {cats[c] for c in d["x_n"][at[g]:at[g + 1]].tolist()}
            for want in wanted:
                if wanted[want] is None and (want in names or (want == "tail" and r["segment"] == "tail"
                                                                and "all_reduce" in names)):
                    wanted[want] = (split, g)
    assert all(wanted.values()), wanted
    return sorted(set(wanted.values()))


def test_dataset_graphs_finish_on_every_rank_in_astra_sim(data, host, simulate, tmp_path):
    ds, rows, _ = data
    for split, g in chosen_graphs(ds, rows):
        out = tmp_path / f"{split}{g}"
        assert stage_in_process(host, "from-dag", ds / f"{split}.npz", "--graph", g, "-o", out)[0] == 0
        status, results = simulate(out)
        summary = results["summary"]
        assert status == 0 and summary["finished_ranks"] == summary["world_size"] >= 2, (split, g, summary)


def test_a_hand_written_dag_finishes_on_every_rank_in_astra_sim(run_stage, simulate, tmp_path):
    done = run_stage("from-dag", PLUGIN_TESTS / "data" / "synthetic.json", "-o", tmp_path / "set", "--gpu", "h100")
    assert done.returncode == 0, done.stderr
    status, results = simulate(tmp_path / "set")
    assert status == 0 and results["summary"]["finished_ranks"] == results["summary"]["world_size"] == 16
    # the step is at least the kernels one after the other on a rank (compute_time_us in the manifest)
    micros = json.loads((tmp_path / "set" / "manifest.json").read_text())["rank_classes"][0]["compute_time_us"]
    assert results["summary"]["max_finish_time_ns"] >= micros * 1000
