"""The plugin's hook: the three schedules, registered by name."""

from stage_core.api import ScheduleSpec, hookimpl

from .schedules import zb_h1, zb_h2, zb_v

SOURCE = "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024 (arXiv 2401.10241)"


@hookimpl
def stage_schedules():
    return [
        ScheduleSpec("zb-h1", zb_h1, "zero bubble H1: 1F1B's memory, W passes delayed into the bubbles", chunks=1,
                     source=SOURCE + ", section 2.1"),
        ScheduleSpec("zb-h2", zb_h2, "zero bubble H2: up to 2p-1 micro-batches in flight, no bubble when "
                                     "F = B = W", chunks=1, source=SOURCE + ", section 2.2"),
        ScheduleSpec("zb-v", zb_v, "zero bubble V: two chunks a stage in a V, 1F1B's memory, no bubble when "
                                   "F = B = W", chunks=2, placement="v", source=SOURCE + ", section 6"),
    ]
