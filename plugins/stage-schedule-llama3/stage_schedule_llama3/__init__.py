"""STAGE schedule plugin: Llama 3's flexible interleaved pipeline schedule (arXiv 2407.21783, section 3.3.2)."""

from .schedules import llama3

__all__ = ["llama3"]
