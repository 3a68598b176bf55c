"""Serving plans on the toy model (h 64, 4 heads, 2 layers, V 128): tp and pp for decode."""

import pytest

from stage_core.api import CollectiveType, NodeType, Plan

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
        assert sample == [(CollectiveType.ALL_GATHER, b * 128 // 2 * 2)]  # each rank's logits over V/tp of 128


# --------------------------------------------------------------------------- disaggregated serving
HEADS, D = 4, 16  # the toy's 4 heads (4 KV groups) of 16


def serve_set(host, tmp_path, prefill: Plan, decode: Plan):
    from stage_core.api import write_trace_set
    from stage_core.api import plan_serve
    from stage_core.testing import read_jsonl

    result = plan_serve(host, "toy", {}, prefill, decode)
    ts = read_jsonl(write_trace_set(host, result, tmp_path / "serve", "jsonl"))  # validated: pairs match
    return result, dict(ts.iter_ranks())


def kv_messages(ranks, kind):
    return [(rank, n.attr("comm_dst" if kind == NodeType.COMM_SEND else "comm_src"), n.attr("comm_size"))
            for rank, nodes in ranks.items() for n in nodes if n.type == kind and n.name.startswith("kv:")]


@pytest.mark.parametrize("pre_tp,dec_tp", [(2, 4), (4, 2), (2, 2)])
def test_each_prompts_cache_goes_to_the_decode_ranks_holding_its_heads(host, tmp_path, pre_tp, dec_tp):
    s, b = 32, 2
    prefill = Plan(task="prefill", tp=pre_tp, micro_batch_size=b, seq_len=s)
    decode = Plan(task="decode", tp=dec_tp, micro_batch_size=4, context_len=s + 1)
    result, ranks = serve_set(host, tmp_path, prefill, decode)
    P = pre_tp
    assert result.job.world_size == pre_tp + dec_tp
    sends = kv_messages(ranks, NodeType.COMM_SEND)
    per_request = 2 * L * HEADS * D * 2 * s  # K and V of every head and layer for the prompt's tokens
    assert sum(n for *_, n in sends) == b * per_request
    # the heads prefill rank i and decode rank j share: their slices of the 4 KV groups overlap
    for src, dst, n in sends:
        i, j = src, dst - P
        lo, hi = max(i * HEADS // pre_tp, j * HEADS // dec_tp), min((i + 1) * HEADS // pre_tp, (j + 1) * HEADS // dec_tp)
        assert n == 2 * L * (hi - lo) * D * 2 * s
    assert len(sends) == b * max(pre_tp, dec_tp)  # one pair per request and overlapping pair of ranks
    assert sorted(kv_messages(ranks, NodeType.COMM_RECV)) == sorted((d, s_, n) for s_, d, n in sends)


def test_context_parallel_prefill_sends_each_ranks_part_of_the_prompt(host, tmp_path):
    s = 32
    prefill = Plan(task="prefill", cp=2, cp_comm="all-gather", micro_batch_size=2, seq_len=s)
    decode = Plan(task="decode", dp=2, micro_batch_size=1, context_len=s + 1)
    result, ranks = serve_set(host, tmp_path, prefill, decode)
    sends = kv_messages(ranks, NodeType.COMM_SEND)
    # request q goes to decode replica q mod 2 (ranks 2 and 3); each CP rank sends its half of the prompt
    assert sorted(sends) == sorted((cp, 2 + q, 2 * L * HEADS * D * 2 * s // 2) for q in range(2) for cp in range(2))


def test_a_decode_micro_batch_starts_once_its_requests_caches_arrived(host, tmp_path):
    prefill = Plan(task="prefill", micro_batch_size=2, micro_batches=2, seq_len=16)
    decode = Plan(task="decode", micro_batch_size=2, micro_batches=2, context_len=17)
    result, ranks = serve_set(host, tmp_path, prefill, decode)
    nodes = ranks[1]
    recvs = {n.id: n.name for n in nodes if n.type == NodeType.COMM_RECV}
    assert sorted(recvs.values()) == [f"kv:recv:request{q}" for q in range(4)]
    waiting = {n.name.split(".")[0]: sorted(set(n.ctrl_deps) & set(recvs)) for n in nodes if set(n.ctrl_deps) & set(recvs)}
    assert {mb: [recvs[i] for i in deps] for mb, deps in waiting.items()} == {
        "mb0": ["kv:recv:request0", "kv:recv:request1"], "mb1": ["kv:recv:request2", "kv:recv:request3"]}
    # the prefill rank sends a micro-batch's caches after that micro-batch's step
    sends = [n for n in ranks[0] if n.type == NodeType.COMM_SEND]
    mb_of = {n.id: n.name.split(".")[0] for n in ranks[0]}
    assert [mb_of[n.data_deps[0]] for n in sends] == ["mb0", "mb0", "mb1", "mb1"]
