"""Hybrid sharded data parallel (HSDP): ZeRO-3 inside groups of N data-parallel ranks,
replicated across the dp / N groups.

PyTorch FSDP's HYBRID_SHARD (Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully
Sharded Data Parallel", VLDB 2023, arXiv 2304.11277: hybrid sharding): parameters,
gradients and optimizer state are sharded over a *shard group* of N ranks and
replicated over the dp / N *replica groups*; a layer's parameters are all-gathered
inside the shard group before its forward and again before its backward, gradients are
reduce-scattered inside the shard group and the shards all-reduced across the replica
groups.  The shard group is a mesh axis of its own carved out of dp (``AxisSpec``): its
N ranks are neighbours in dp (``dps``), the replicas one rank of each group (``dpr``).

The strategy only declares placements: parameters stored ``Shard(FLAT)`` on ``dps``
(gathered where used), gradients reduced to ``Shard(FLAT)`` on ``dps`` and ``Replicate``
on ``dpr``, gradients and optimizer state kept sharded on ``dps``; the core's propagation
and lowering derive the gathers and the two-level gradient sync.
"""

from __future__ import annotations

from stage_core.api import FLAT, AxisSpec, OptionSpec, Replicate, Shard, ShardedGraph, expert_tensors

#: the option that turns it on, and the axis it carves out of dp
OPTION = "shard-group"
SHARD, REPLICA = "dps", "dpr"
AXIS = AxisSpec(SHARD, within="dp", option=OPTION, rest=REPLICA,
                description="hybrid sharding's shard group: N neighbouring data-parallel ranks (dpr: one rank of "
                            "each group, the replicas)")
SHARD_GROUP = OptionSpec(OPTION, int, 1, "hybrid sharding: shard parameters, gradients and optimizer state over N "
                                         "neighbouring data-parallel ranks, replicated across dp / N (1: off)",
                         metavar="N")


def shard_group(plan) -> int:
    return plan.option(OPTION, 1)


def validate(graph, plan) -> list[str]:
    n = shard_group(plan)
    if n == 1:
        return []
    if plan.inference:
        return [f"--{OPTION} {n}: hybrid sharding shards training state (gradients, optimizer); --task {plan.task} "
                f"has no backward (use --task train)"]
    out = []
    if plan.zero:
        out.append(f"--{OPTION} {n} with --zero {plan.zero}: hybrid sharding shards the model state itself (ZeRO-3 "
                   f"inside each group of {n}); leave --zero out")
    if plan.ep > 1:
        out.append(f"--{OPTION} {n} with --ep {plan.ep}: the experts' data-parallel group is another view of the "
                   f"ranks, which hybrid sharding does not split; leave one out")
    return out


def apply(sg: ShardedGraph, mesh, plan) -> ShardedGraph:
    if shard_group(plan) == 1 or plan.inference:
        return sg
    sg.grad_target[SHARD] = Shard(FLAT)  # reduce-scatter inside the shard group
    sg.grad_target[REPLICA] = Replicate()  # then all-reduce the shard across the replicas
    sg.grad_storage_sharded.add(SHARD)
    sg.optimizer_sharded.add(SHARD)
    experts = expert_tensors(sg.graph)
    for p in sg.graph.params:
        if p in experts:
            continue
        layout = dict(sg.storage_layout(p))
        layout[SHARD] = Shard(FLAT)  # stored sharded in the group, gathered where used
        sg.param_storage[p] = layout
    return sg
