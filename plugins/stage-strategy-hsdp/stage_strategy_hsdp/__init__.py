"""STAGE strategy plugin: hybrid sharded data parallel (--shard-group N)."""
