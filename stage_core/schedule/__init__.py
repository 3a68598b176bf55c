"""Pipeline schedules as orderings of (kind, micro-batch, chunk) steps per pipeline rank."""

from .orders import gpipe, interleaved_1f1b, one_f_one_b

__all__ = ["gpipe", "one_f_one_b", "interleaved_1f1b"]
