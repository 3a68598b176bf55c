"""The plugin's hook: the hsdp strategy, its option --shard-group and its axis."""

from stage_core.api import StrategySpec, hookimpl

from . import strategy as s


@hookimpl
def stage_strategies():
    return [StrategySpec("hsdp", s.SHARD, s.validate, s.apply, order=42,
                         description="hybrid sharded data parallel (PyTorch FSDP's HYBRID_SHARD): ZeRO-3 inside "
                                     "groups of --shard-group N data-parallel ranks, replicated across dp / N",
                         options=(s.SHARD_GROUP,), axes=(s.AXIS,))]
