"""htsim's fat tree from a preset (numbers by hand), a user's .topo, and the htsim backend
through the command with a stand-in binary (the real one: tests/integration/test_htsim.py)."""

import io
import json

import pytest
from stage_core.api import UsageError

from astrasim_test_presets import TEST_PRESETS
from stage_adapter_astrasim import command, htsim, simulate

H100, A100 = TEST_PRESETS["h100"], TEST_PRESETS["a100"]


@pytest.fixture(autouse=True)
def _test_presets(host, monkeypatch):
    monkeypatch.setattr(command, "PluginHost", lambda: host)
    monkeypatch.setattr(simulate, "PluginHost", lambda: host)


def test_one_node_is_one_switch():
    """450 GB/s x 400 GiB/450 GB efficiency = 3,435.97 Gb/s, written 3,436; 936.25 ns, 936.
    The format wants two tiers: one uplink (Oversubscribed = hosts / uplinks), unused."""
    tree = htsim.fat_tree(H100, 4)
    assert (tree.nodes, tree.tor_hosts, tree.tor_uplinks, tree.oversubscribed) == (4, 4, 1, 4)
    assert (tree.host_gbps, tree.host_latency_ns, tree.up_gbps, tree.agg_down) == (3436, 936, 3436, 1)
    text = tree.render()
    assert "Nodes 4\nTiers 2\nPodsize 4\n\nTier 0\nDownlink_speed_Gbps 3436\nRadix_Down 4\nRadix_Up 1\n" \
           "Oversubscribed 4\nDownlink_Latency_ns 936\n" in text


def test_nodes_get_an_uplink_per_gpu_at_the_scale_out_speed():
    """h100 on 2 nodes: IB 50 GB/s x efficiency = 381.77 Gb/s, written 382; the loader wants
    16 x host / 382 whole, so the host speed is a multiple of 382 / gcd(2, 382) = 191:
    3,435.97 is 17.99 of them, 18 x 191 = 3,438.  Uplinks counted by the loader: 2 x
    3,438 / 382 = 18 per aggregation switch (8 of them, one per GPU's rail); 2,643.5 ns
    rounds to 2,644.  a100 on 3 nodes: 190.89 -> 191 (prime), 2,290.65 -> 12 x 191 = 2,292,
    3 x 2,292 / 191 = 36."""
    tree = htsim.fat_tree(H100, 16)
    assert (tree.tor_hosts, tree.tor_uplinks, tree.oversubscribed) == (8, 8, 1)
    assert (tree.host_gbps, tree.up_gbps, tree.up_latency_ns, tree.agg_down) == (3438, 382, 2644, 18)
    assert tree.notes[0].startswith("scale-up 3,436.0 Gb/s written as 3,438")
    tree = htsim.fat_tree(A100, 24)
    assert (tree.host_gbps, tree.up_gbps, tree.agg_down) == (2292, 191, 36)


def test_what_htsims_switches_cannot_hold_is_refused():
    with pytest.raises(UsageError, match="1024 ranks: 128 nodes need aggregation switches of 128 ports, htsim's have "
                                         "at most 64 .* the most it builds is 512 ranks"):
        htsim.fat_tree(H100, 1024)


def test_a_users_topology_must_carry_the_world(tmp_path):
    topo = tmp_path / "t.topo"
    topo.write_text("Nodes 8\nTiers 2\nPodsize 8\nTier 0\nRadix_Down 8\nRadix_Up 8\n")
    assert htsim.read_topology(str(topo), 8).startswith("Nodes 8")
    with pytest.raises(UsageError, match=r"Nodes 8 but the trace set has world size 16: htsim needs one host per rank"):
        htsim.read_topology(str(topo), 16)
    topo.write_text("Nodes 8\nTier 0\nRadix_Down 64\nRadix_Up 64\n")
    with pytest.raises(UsageError, match="tier 0 switches of 64 \\+ 64 ports; htsim's have at most 96"):
        htsim.read_topology(str(topo), 8)
    topo.write_text("Nodes 8\nTier 0\nDownlink_speed_Gbps 3200.5\n")
    with pytest.raises(UsageError, match="line 3: '3200.5' is not a whole number"):
        htsim.read_topology(str(topo), 8)


def _run(root, **kw):
    out, err = io.StringIO(), io.StringIO()
    kw.setdefault("env", {})
    status = command.run_astrasim(root, out=out, err=err, as_json=True, **kw)
    return status, json.loads(out.getvalue()), err.getvalue()


def test_a_binary_named_htsim_runs_as_htsim_in_a_scratch_folder(make_trace_set, fake_simulator, sample_stdout,
                                                                 monkeypatch):
    """The backend comes from the binary's name; htsim gets --htsim_opts -topo FILE last and
    runs in a folder of its own (its ./log, ./logout.dat and ./idmap.txt), removed after."""
    root = make_trace_set(8)
    binary = fake_simulator(sample_stdout, name="htsim")
    binary.write_text(binary.read_text().replace(
        "json.dump(sys.argv, open('argv.json', 'w'))",
        "import os; json.dump([os.getcwd()] + sys.argv, open(os.path.join(os.environ['SPY'], 'argv.json'), 'w')); "
        "open('logout.dat', 'w').write('x')"))
    monkeypatch.setenv("SPY", str(root))  # where the stand-in leaves its working folder and argv
    status, results, err = _run(root, astra_sim=str(binary))
    assert status == 0 and results["backend"] == "htsim" and results["topology"] == "preset h100"
    cwd, *argv = json.loads((root / "argv.json").read_text())
    work = root / "astrasim"
    assert argv[-3:] == ["--htsim_opts", "-topo", str(work / "topology.topo")]
    assert cwd != str(work) and cwd.startswith(str(work)) and not (work / cwd.rsplit("/", 1)[1]).exists()
    assert sorted(p.name for p in work.iterdir()) == [".stage-folder.json", "logging.toml", "memory.json", "network.yml",
                                                     "results.json", "stderr.txt", "stdout.txt", "system.json",
                                                     "topology.topo"]
    assert "note: htsim cannot express a GPU's two ports" in err


def test_the_congestion_aware_backend_takes_one_node(make_trace_set):
    with pytest.raises(UsageError) as refused:
        _run(make_trace_set(16), backend="analytical-aware")
    assert str(refused.value) == ("the analytical-aware backend takes a network of one dimension, and world size 16 "
                                  "spans 2 nodes of 8 (preset h100): use --backend analytical, or --network FILE "
                                  "with one dimension")


def test_topology_is_htsims_option(make_trace_set, tmp_path):
    with pytest.raises(UsageError, match="--topology is htsim's fat tree; the analytical backend takes --network"):
        _run(make_trace_set(8), topology=str(tmp_path / "t.topo"))
