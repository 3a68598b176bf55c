"""Collectives that fall out of placements (WORKED-EXAMPLES.md), on the core's toy model.

The strategies here are declared directly on a ShardedGraph, as a strategy plugin
would; the published volumes come from REFERENCE §3.
"""

from collections import Counter

import pytest

from stage_core.autodiff import differentiate
from stage_core.parallel import Mesh, P, Plan, R, Shard, ShardedGraph, conjugate, lower, propagate, transition_kind
from stage_core.testing import ToyConfig, build_toy
from stage_core.trace import CollectiveType as C


def test_transition_table():
    assert transition_kind(P, R) is C.ALL_REDUCE
    assert transition_kind(P, Shard(1)) is C.REDUCE_SCATTER
    assert transition_kind(Shard(0), R) is C.ALL_GATHER
    assert transition_kind(Shard(0), Shard(1)) is C.ALL_TO_ALL
    assert transition_kind(R, Shard(0)) is None
    assert conjugate(C.ALL_GATHER) is C.REDUCE_SCATTER and conjugate(C.REDUCE_SCATTER) is C.ALL_GATHER


def lowered(plan: Plan, declare, cfg=ToyConfig()):
    forward = build_toy(cfg)
    sg = ShardedGraph(differentiate(forward), {a: plan.degree(a) for a in ("tp", "cp", "dp", "pp", "ep")})
    declare(sg)
    dims = dict(forward.dims, b=plan.micro_batch_size * plan.dp, s=cfg.seq_len)
    return lower(propagate(sg), plan, Mesh.from_plan(plan), dims), forward, dims


def dp(sg):
    sg.shard_inputs("dp", "b")
    sg.grad_target["dp"] = R


def megatron_tp(sp: bool):
    def declare(sg):
        sg.shard_params("tp", ("g", "f", "V"))
        sg.hint("residual", "tp", Shard("s") if sp else R)
    return declare


def colls(low):
    return [n for n in low.programs[0].nodes if n.comm_type is not None]


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_dp_all_reduces_every_gradient_once_per_step(micro_batches):
    plan = Plan(dp=4, micro_batches=micro_batches, bucket_params=10_000)
    low, forward, dims = lowered(plan, dp)
    from stage_core.models import param_counts
    psi, _ = param_counts(forward)
    ars = colls(low)
    assert {(n.comm_type, n.group) for n in ars} == {(C.ALL_REDUCE, "dp")}
    assert len(ars) > 1  # buckets of 10,000 parameters
    assert sum(n.comm_size for n in ars) == 2 * psi  # bf16 gradients, once, whatever the micro-batches
    # every bucket waits for the last micro-batch's backward
    last_bwd = min(n.id for n in low.programs[0].nodes if n.name.startswith(f"mb{micro_batches - 1}.bwd"))
    assert all(n.id > last_bwd for n in ars)


def test_tp_without_sp_four_all_reduces_per_layer_of_sbh2_bytes():
    cfg = ToyConfig(layers=3)
    low, _, dims = lowered(Plan(tp=2), megatron_tp(False), cfg)
    s, h = cfg.seq_len, cfg.hidden
    layer = [n for n in colls(low) if ".layers." in n.name]
    assert Counter(n.comm_type for n in layer) == {C.ALL_REDUCE: 4 * cfg.layers}
    assert {n.comm_size for n in layer} == {s * 1 * h * 2}


def test_tp_with_sp_turns_each_all_reduce_into_gather_and_scatter():
    cfg = ToyConfig(layers=3)
    low, _, _ = lowered(Plan(tp=2, sp=True), megatron_tp(True), cfg)
    s, h, t = cfg.seq_len, cfg.hidden, 2
    layer = [n for n in colls(low) if ".layers." in n.name]
    kinds = Counter(n.comm_type for n in layer)
    # per layer: 4 reduce-scatters (2 forward, 2 backward) and their 4 all-gathers, plus
    # the 2 re-gathers of the column-parallel inputs for the weight gradients in backward
    # (Korthikanti et al. 2022, section 4.2.2)
    assert kinds == {C.REDUCE_SCATTER: 4 * cfg.layers, C.ALL_GATHER: 6 * cfg.layers}
    assert {n.comm_size for n in layer if n.comm_type == C.REDUCE_SCATTER} == {s * h * 2}  # full input
    assert {n.comm_size for n in layer if n.comm_type == C.ALL_GATHER} == {s * h * 2 // t}  # per-rank shard
    assert all(n.group == "tp" for n in layer)


# --------------------------------------------------------------------------- partial sums meeting at one tensor


def _swiglu_with_side_reader(h=64, f=128, s=32):
    """norm -> SwiGLU MLP (gate, up: column parallel) plus a replicated-weight reader of the
    norm output (a router's logits), summed into the residual: the norm output's gradient
    has two Partial parts over tp (gate, up) and one Replicate or Sharded part."""
    from stage_core.ir import blocks
    from stage_core.ir.builder import GraphBuilder

    g = GraphBuilder("swiglu", dims={"h": h, "f": f, "V": 128, "r": 8}, dtype="bf16")
    x, labels, wte = blocks.embed(g)
    y = blocks.norm(g, x, "norm")
    mlp = blocks.swiglu_mlp(g, y)
    side = g.einsum("bsh,hr->bsr", y, g.param("side.weight", ("h", "r")), name="side")
    back = g.einsum("bsr,rh->bsh", side, g.param("side_out.weight", ("r", "h")), name="side_out")
    x = g.add(x, g.add(mlp, back, name="join"), name="residual", tags=("residual",))
    return blocks.lm_head(g, x, labels, wte, tied=True), s


@pytest.mark.parametrize("sp", [False, True])
def test_partial_gradients_meeting_at_one_tensor_are_reduced_once(sp):
    forward, s = _swiglu_with_side_reader()
    plan = Plan(tp=2, sp=sp)
    sg = ShardedGraph(differentiate(forward), {"tp": 2})
    sg.shard_params("tp", ("f", "V"))
    sg.hint("residual", "tp", Shard("s") if sp else R)
    prop = propagate(sg)
    low = lower(prop, plan, Mesh.from_plan(plan), dict(forward.dims, b=1, s=s))
    acc = [n for n in colls(low) if "norm.grad_acc" in n.name]
    # gate and up give Partial input gradients over tp; the side reader's is Replicate
    # (without SP: it joins the sum as Partial) or Sharded on s (with SP: the two
    # Partial parts are summed by an op of their own first): one reduction either way
    assert [n.comm_type for n in acc] == [C.REDUCE_SCATTER if sp else C.ALL_REDUCE]
    assert acc[0].comm_size == s * 64 * 2
    split = [op.name for op in prop.ops if op.name.endswith("partial_sum")]
    assert split == (["norm.grad_acc.norm.partial_sum"] if sp else [])
    # the split keeps the sum's FLOPs: three parts, two adds per element
    acc_flops = sum(n.num_ops for n in low.programs[0].nodes if "norm.grad_acc" in n.name and n.comm_type is None)
    if sp:  # the Partial pair on the whole sequence, then the reduced sum plus the side part on s/2
        assert acc_flops == s * 64 + (s // 2) * 64
    else:
        assert acc_flops == 2 * s * 64


def test_a_degree_that_does_not_divide_a_batch_dim_names_the_batch_flags():
    from stage_core.errors import UsageError

    def declare(sg):
        sg.shard_inputs("tp", "b")  # a strategy splitting the micro-batch over tp

    with pytest.raises(UsageError, match="does not divide dim b = 1 .*raise --micro-batch-size \\(b is micro-batch "
                                         "size x dp\\) so that it divides"):
        lowered(Plan(tp=2), declare)
