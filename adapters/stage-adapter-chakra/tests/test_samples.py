"""Files written by mlcommons/chakra's own generator decode, and re-encode byte for byte."""

from __future__ import annotations

from stage_core.api import CollectiveType, NodeType

from stage_adapter_chakra import etread, wire


def test_sample_set_decodes(samples_dir):
    assert etread.detect(samples_dir)
    ts = etread.read(samples_dir)
    assert ts.world_size == 8
    assert ts.comm_groups == {}  # that generator writes no comm-group file
    assert ts.metadata["version"] == "0.0.4"
    assert ts.metadata["prefix"] == "all_reduce"
    ranks = []
    for rank, nodes in ts.iter_ranks():
        ranks.append(rank)
        assert len(nodes) == 1
        (node,) = nodes
        assert node.id == rank  # the generator numbers nodes with one global counter
        assert node.name == "all_reduce_8npus_1MB"
        assert node.type == NodeType.COMM_COLL == 7
        assert node.data_deps == [] and node.ctrl_deps == []
        assert node.attrs == {
            "is_cpu_op": ("bool_val", False),
            "comm_type": ("int64_val", CollectiveType.ALL_REDUCE),
            "comm_size": ("int64_val", 1048576),
        }
    assert ranks == list(range(8))


def test_sample_file_metadata(samples_dir):
    meta, nodes = etread.read_et_file(samples_dir / "all_reduce.3.et")
    assert meta == {"version": "0.0.4", "attrs": {}}
    assert nodes[0].attr("comm_size") == 1 << 20


def test_our_encoder_reproduces_the_samples(samples_dir):
    for rank in range(8):
        body = wire.node_head(rank, "all_reduce_8npus_1MB", 7) + b"".join([
            wire.attribute("is_cpu_op", "bool_val", False),
            wire.attribute("comm_type", "int64_val", 0),
            wire.attribute("comm_size", "int64_val", 1048576),
        ])
        expected = (samples_dir / f"all_reduce.{rank}.et").read_bytes()
        assert wire.frame(wire.metadata("0.0.4")) + wire.frame(body) == expected
