"""The wire bytes a report states (issue 25) against the files: each collective node's
comm_size, as Chakra's reader gives it, times the ring factor of its type on its group's
size in comm_groups.json (all-reduce 2(n-1)/n, reduce-scatter and all-to-all (n-1)/n,
all-gather n-1), plus the sends and receives, summed per rank, must equal the manifest's
``wire_bytes`` of the rank's class; and ``stage report``, which extrapolates a large
micro-batch count from a small one, states the same numbers as the written set."""

import json

import pytest

from stage_core import hardware
from stage_core.cli import main
from stage_core.flow import read_trace_set
from stage_core.trace import COMM_KEYS, NodeType

PLANS = [
    # tp all-reduces (n 4), dp gradient all-reduce (n 2), pipeline sends
    ["--tp", "4", "--dp", "2", "--pp", "2", "--micro-batches", "6"],
    # sequence parallel: all-gather (n-1 shards) and reduce-scatter over tp; ZeRO-1's parameter all-gather over dp
    ["--tp", "2", "--sp", "--dp", "4", "--zero", "1", "--micro-batches", "5"],
    # MoE: all-to-all dispatch and combine over ep
    ["--model", "moe-tiny", "--dp", "4", "--ep", "4", "--micro-batches", "5"],
]


def wire_of_files(trace_set) -> dict[int, dict[str, int]]:
    sizes = {name: len(members) for name, members in trace_set.comm_groups.items()}
    out = {}
    for rank, nodes in trace_set.iter_ranks():
        wire = dict.fromkeys((*COMM_KEYS.values(), "send", "recv"), 0)
        for n in nodes:
            if n.type == NodeType.COMM_COLL:
                kind = COMM_KEYS[n.attr("comm_type")]
                wire[kind] += hardware.wire_bytes(kind, n.attr("comm_size"), sizes[n.attr("pg_name")])
            elif n.type in (NodeType.COMM_SEND, NodeType.COMM_RECV):
                wire["send" if n.type == NodeType.COMM_SEND else "recv"] += n.attr("comm_size")
        out[rank] = wire
    return out


@pytest.mark.parametrize("plan", PLANS, ids=["tp-dp-pp", "sp-zero1", "moe-ep"])
def test_the_manifests_wire_bytes_are_the_files(host, capsys, tmp_path, plan):
    argv = plan if "--model" in plan else ["--model", "gpt-tiny", *plan]
    assert main(["generate", *argv, "-o", str(tmp_path / "set"), "--quiet"], host=host) == 0
    capsys.readouterr()
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    files = wire_of_files(read_trace_set(host, tmp_path / "set"))
    kinds_seen = set()
    for rc in manifest["rank_classes"]:
        for rank in rc["ranks"]:
            assert files[rank] == rc["wire_bytes"], (rank, files[rank], rc["wire_bytes"])
        kinds_seen |= {k for k, v in rc["wire_bytes"].items() if v}
    # the report (extrapolated past 4 micro-batches, no programs lowered) says the same
    assert main(["report", *argv, "--json"], host=host) == 0
    reported = json.loads(capsys.readouterr().out)
    assert [rc["wire_bytes"] for rc in reported["rank_classes"]] == [rc["wire_bytes"]
                                                                     for rc in manifest["rank_classes"]]
    expected = {"tp-dp-pp": {"all_reduce", "send", "recv"}, "sp-zero1": {"all_gather", "reduce_scatter"},
                "moe-ep": {"all_to_all"}}
    assert expected[{0: "tp-dp-pp", 1: "sp-zero1", 2: "moe-ep"}[PLANS.index(plan)]] <= kinds_seen
