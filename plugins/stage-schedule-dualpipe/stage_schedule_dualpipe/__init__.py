"""STAGE schedule plugin: DualPipeV (DeepSeek-V3 technical report, 2024)."""

from .schedules import dualpipe_v

__all__ = ["dualpipe_v"]
