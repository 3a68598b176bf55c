"""STAGE schedule plugin: DualPipe and DualPipeV (DeepSeek-V3 technical report, 2024)."""

from .schedules import dualpipe, dualpipe_v

__all__ = ["dualpipe", "dualpipe_v"]
