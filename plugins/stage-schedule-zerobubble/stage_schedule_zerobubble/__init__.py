"""STAGE schedule plugin: ZB-H1, ZB-H2 and ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism")."""

from .schedules import zb_h1, zb_h2, zb_v

__all__ = ["zb_h1", "zb_h2", "zb_v"]
