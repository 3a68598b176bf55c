"""The plugin's hook."""

from stage_core.api import ScheduleSpec, hookimpl

from .schedules import dualpipe_v


@hookimpl
def stage_schedules():
    return [ScheduleSpec("dualpipev", dualpipe_v, "DualPipeV: two chunks a stage in a V, forwards and backwards of "
                                                  "two micro-batches overlapped", chunks=2, placement="v",
                         source="DeepSeek-V3 technical report (arXiv 2412.19437) section 3.2.1; deepseek-ai/DualPipe")]
