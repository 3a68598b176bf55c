"""Generated traces, decoded attribute by attribute, against the Chakra contract (REFERENCE §6);
determinism; the validator on a broken set; `stage astrasim` on a generated set."""

import json
import os
import sys

import pytest

from stage_adapter_chakra import etread
from stage_core.trace import CollectiveType, NodeType

# REFERENCE §6 and the consumers' readers: attribute -> (oneof, unit)
CONTRACT = {
    NodeType.COMP: {"is_cpu_op": ("bool_val", None), "num_ops": ("int64_val", "FLOPs"),
                    "tensor_size": ("uint64_val", "bytes")},
    NodeType.COMM_COLL: {"is_cpu_op": ("bool_val", None), "comm_type": ("int64_val", None),
                         "comm_size": ("int64_val", "bytes"), "pg_name": ("string_val", None)},
}
SIMULATED = {CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER, CollectiveType.REDUCE_SCATTER,
             CollectiveType.ALL_TO_ALL}


@pytest.fixture(scope="module")
def gpt_set(tmp_path_factory, run_stage):
    out = tmp_path_factory.mktemp("gpt") / "set"
    done = run_stage("generate", "--model", "gpt-tiny", "--tp", "2", "--sp", "--dp", "2", "--zero", "1", "-o", out)
    assert done.returncode == 0, done.stderr
    return out


def test_every_attribute_has_the_contracts_name_oneof_and_unit(gpt_set):
    manifest = json.loads((gpt_set / "manifest.json").read_text())
    ts = etread.read(gpt_set)
    assert ts.metadata["version"] == "0.0.4"
    groups = ts.comm_groups
    for rank, nodes in ts.iter_ranks():
        flops = {"matmul": 0, "all": 0}
        comm = {}
        for n in nodes:
            expected = CONTRACT[NodeType(n.type)]
            assert {k: v[0] for k, v in n.attrs.items()} == {k: v[0] for k, v in expected.items()}, n.name
            assert n.attr("is_cpu_op") is False
            if n.type == NodeType.COMP:
                assert n.attr("num_ops") > 0 and n.attr("tensor_size") > 0
                flops["all"] += n.attr("num_ops")
            else:
                kind = CollectiveType(n.attr("comm_type"))
                assert kind in SIMULATED
                assert rank in groups[n.attr("pg_name")]
                key = kind.name.lower()
                comm[key] = comm.get(key, 0) + n.attr("comm_size")
        rc = next(c for c in manifest["rank_classes"] if rank in c["ranks"])
        # units: the traces' FLOPs are the manifest's FLOPs (gathers, which have none,
        # are written as 1 op so the roofline times them by their bytes)
        gathers = sum(1 for n in nodes if n.type == NodeType.COMP and n.attr("num_ops") == 1)
        assert flops["all"] - gathers == rc["flops"]["total"]
        assert comm == {k: v for k, v in rc["comm_bytes"].items() if v}


def test_same_inputs_give_identical_bytes_and_group_ids(run_stage, tmp_path):
    args = ["generate", "--model", "gpt-tiny", "--tp", "2", "--dp", "2", "--micro-batches", "2"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_stage(*args, "-o", a).returncode == 0
    assert run_stage(*args, "-o", b).returncode == 0
    for f in sorted(a.iterdir()):
        assert f.read_bytes() == (b / f.name).read_bytes(), f.name
    groups = json.loads((a / "comm_groups.json").read_text())
    assert sorted(groups, key=int) == [str(i) for i in range(1, len(groups) + 1)]


def test_validate_refuses_a_broken_set_naming_rank_node_and_reason(run_stage, gpt_set, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in gpt_set.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    groups = json.loads((broken / "comm_groups.json").read_text())
    victim = next(name for name, members in groups.items() if 3 in members)
    groups[victim] = [r for r in groups[victim] if r != 3]  # rank 3 no longer in one of its groups
    (broken / "comm_groups.json").write_text(json.dumps(groups))
    done = run_stage("validate", broken)
    assert done.returncode == 1
    assert "rank 3, node" in done.stderr and "not a member" in done.stderr
    assert run_stage("validate", gpt_set).returncode == 0


def test_astrasim_prints_the_exact_command_without_a_binary(run_stage, gpt_set):
    done = run_stage("astrasim", gpt_set, "--system", "h100", env={"ASTRA_SIM_BIN": ""})
    assert done.returncode == 0, done.stderr
    for flag in ("--workload-configuration=", "--comm-group-configuration=", "--system-configuration=",
                 "--network-configuration=", "--remote-memory-configuration="):
        assert flag in done.stdout
    assert f"{gpt_set}/trace" in done.stdout
    assert (gpt_set / "astrasim" / "system.json").exists()


def test_astrasim_runs_a_simulator_and_prints_the_table(run_stage, gpt_set, tmp_path):
    # a stand-in binary that prints what ASTRA-sim prints for every rank of the set
    fake = tmp_path / "fake-astra-sim"
    fake.write_text(f"#!{sys.executable}\n" + "\n".join([
        "for r in range(4):",
        "    print(f'[workload] [info] sys[{r}] finished, {2500000 + 1000 * r} cycles, exposed communication 5000 cycles.')",
    ]) + "\n")
    fake.chmod(0o755)
    done = run_stage("astrasim", gpt_set, "--astra-sim", fake)
    assert done.returncode == 0, done.stderr
    results = json.loads((gpt_set / "astrasim" / "results.json").read_text())
    assert "2.503" in done.stdout  # rank 3's finish, in ms
    assert results["summary"]["max_finish_time_ns"] == 2503000
    assert results["summary"]["deadlocked_ranks"] == []


@pytest.mark.skipif(not os.environ.get("ASTRA_SIM_BIN"), reason="ASTRA_SIM_BIN is not set: no simulator here")
def test_the_real_simulator_finishes_every_rank(run_stage, gpt_set):
    done = run_stage("astrasim", gpt_set, "--json")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert not results["summary"]["deadlocked_ranks"]
