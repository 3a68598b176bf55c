"""Context parallel (--cp N, --cp-comm p2p|all-gather|a2a), declared as placements.

Every rank of a CP group holds 2 of the 2·cp chunks of each sequence, chunks i and
2·cp−1−i (Megatron's load balancing: with a causal mask every rank then computes the
same share of attention).  Tokens are sharded on ``s``, so every op outside attention
runs on s/cp tokens with no communication, and a weight gradient, which sums over the
tokens, is Partial over cp: CP joins the data-parallel gradient reduction (dp × cp).
How attention meets the keys of the other ranks is the algorithm:

* ``all-gather`` (Llama 3): the keys and values are whole in the kernel's key letter and
  arrive sharded, so propagation gathers them (S→R, all-gather); backward gathers them
  again, and their gradients, Partial over cp, reduce-scatter back to their shards.
* ``a2a`` (DeepSpeed-Ulysses): attention prefers its heads sharded over cp, the rest of
  the layer the sequence, so q, k and v go sequence→heads and the context heads→sequence
  (S(i)→S(j), all-to-all); backward reads the tensors forward moved and moves only
  the gradients: 4 all-to-alls each way.
* ``p2p`` (TransformerEngine's ring attention): no placement gives it; the fused
  attention kernel declares that it streams its key letter around a ring, and lowering
  writes the cp−1 sends and receives of K/V (and cp of K/V and dK/dV in backward)
  between the cp blocks of the kernel.

docs/context-parallel.md has each algorithm's volumes per layer.
"""

from __future__ import annotations

from stage_core.api import Replicate, ShardedGraph, divisors

#: the attention core's head letter for Ulysses: query groups, or heads where a model has none (MLA)
HEAD_DIMS = ("g", "a")


def _chunks(plan) -> int:
    """Sequence chunks per sequence: 2 per CP rank (load balancing), split again over tp with --sp."""
    return 2 * plan.cp * (plan.tp if plan.sp else 1)


def has_sequence(graph) -> bool:
    """Whether the model's inputs have the plan's sequence dim ``s`` (an image CNN has none)."""
    return any(getattr(d, "name", None) == "s" for t in graph.inputs for d in t.shape)


def validate_cp(graph, plan) -> list[str]:
    if plan.cp == 1:
        return []
    if not has_sequence(graph):
        return [f"--cp {plan.cp}: context parallel splits each sequence; {graph.name} has no sequence dim (an image "
                f"model); split its images with --dp"]
    out = []
    chunks = _chunks(plan)
    if plan.seq_len % chunks:
        per = 2 * (plan.tp if plan.sp else 1)
        valid = [str(d) for d in divisors(plan.seq_len // per)][:24] if plan.seq_len % per == 0 else ["1"]
        out.append(f"--cp {plan.cp}: each sequence splits into 2 x cp{' x tp (--sp)' if plan.sp else ''} = {chunks} "
                   f"chunks (two per CP rank, for a balanced causal mask); --seq-len {plan.seq_len} does not divide "
                   f"by {chunks}; valid --cp: {', '.join(valid)}")
    attention = [op for op in graph.ops if op.block == "attn_core"]
    if any("window" in op.attrs for op in attention):
        out.append(f"--cp {plan.cp}: context parallel with sliding-window attention is not modelled "
                   f"(the window's cost does not split evenly over the chunks)")
    elif plan.cp_comm == "p2p" and not any(op.attrs.get("ring_letter") for op in attention):
        out.append(f"--cp {plan.cp} --cp-comm p2p: ring attention needs the fused attention kernel; this model's "
                   f"attention is computed in separate kernels (--set attention=flash, or --cp-comm all-gather or a2a)")
    if plan.cp_comm == "a2a":
        name = next((d for d in HEAD_DIMS if d in graph.dims), None)
        heads = graph.dims.get(name) if name else None
        if heads is None or heads % (plan.cp * plan.tp):
            valid = [str(d) for d in divisors(heads // plan.tp)] if heads and heads % plan.tp == 0 else ["1"]
            out.append(f"--cp {plan.cp} --cp-comm a2a: all-to-all attention splits the {heads} attention "
                       f"{'query groups' if name == 'g' else 'heads'} over cp x tp = {plan.cp * plan.tp}; "
                       f"valid --cp: {', '.join(valid)}")
    return out


def apply_cp(sg: ShardedGraph, mesh, plan) -> ShardedGraph:
    if plan.cp == 1:
        return sg
    sg.shard_inputs("cp", "s")  # each rank holds its two chunks of every sequence
    sg.grad_target["cp"] = Replicate()  # weight gradients sum over the tokens: reduced with dp
    if plan.cp_comm == "a2a":
        sg.prefer_dims("cp", ("s",))
        sg.prefer_dims("cp", HEAD_DIMS, block="attn_core")
        sg.reuse_forward.add("cp")
    elif plan.cp_comm == "p2p":
        sg.rings.add("cp")
    return sg
