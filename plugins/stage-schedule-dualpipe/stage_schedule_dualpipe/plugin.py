"""The plugin's hook."""

from stage_core.api import ScheduleSpec, hookimpl

from .schedules import dualpipe, dualpipe_v

SOURCE = "DeepSeek-V3 technical report (arXiv 2412.19437) section 3.2.1; deepseek-ai/DualPipe"


@hookimpl
def stage_schedules():
    return [ScheduleSpec("dualpipe", dualpipe, "DualPipe: micro-batches fed from both ends through two copies of the "
                                               "model, forwards and backwards of two micro-batches overlapped",
                         chunks=2, placement="dual", source=SOURCE),
            ScheduleSpec("dualpipev", dualpipe_v, "DualPipeV: two chunks a stage in a V, forwards and backwards of "
                                                  "two micro-batches overlapped", chunks=2, placement="v",
                         source=SOURCE)]
