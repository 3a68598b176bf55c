"""Serving plans on the toy model (h 64, 4 heads, 2 layers, V 128): tp and pp for decode."""

from stage_core.parallel import Plan
from stage_core.trace import CollectiveType, NodeType

H, L = 64, 2


def test_pipelined_decode_sends_each_sampled_token_back_to_the_first_stage(traces):
    b, m, n = 2, 2, 3
    result, ts, ranks = traces(Plan(task="decode", pp=2, micro_batch_size=b, micro_batches=m, context_len=16,
                                    decode_steps=n))  # written and validated: every send meets its recv
    fed_back = [node for node in ranks[0] if node.type == NodeType.COMM_RECV and "feedback" in node.name]
    assert len(fed_back) == (n - 1) * m
    assert {node.attr("comm_size") for node in fed_back} == {8 * b}  # b int64 token ids
    assert {node.attr("comm_src") for node in fed_back} == {1}
    # activations go forward once per micro-batch per step: [b, 1, h] bf16
    acts = [node for node in ranks[0] if node.type == NodeType.COMM_SEND]
    assert len(acts) == n * m and {node.attr("comm_size") for node in acts} == {b * H * 2}
    # no backward, no gradient traffic
    assert not any(node.type == NodeType.COMM_COLL for nodes in ranks.values() for node in nodes)


def test_tensor_parallel_decode_all_reduces_once_per_block(traces):
    b = 4
    result, ts, ranks = traces(Plan(task="decode", tp=2, micro_batch_size=b, context_len=16))
    for rank, nodes in ranks.items():
        colls = [(node.name, node.attr("comm_type"), node.attr("comm_size")) for node in nodes
                 if node.type == NodeType.COMM_COLL]
        reduced = sorted(name.rsplit(":", 1)[1] for name, kind, size in colls
                         if (kind, size) == (CollectiveType.ALL_REDUCE, b * H * 2))
        # after attention and after the MLP of each layer; the vocabulary-parallel embedding once
        assert reduced == sorted(["embedding"] + [f"layers.{i}.{o}" for i in range(L) for o in ("attn.out", "mlp.fc2")])
        assert len(colls) == 2 * L + 2
        sample = [c[1:] for c in colls if "sample" in c[0]]
        assert sample == [(CollectiveType.ALL_GATHER, 8 * b)]  # each rank's best logit (value, index)
