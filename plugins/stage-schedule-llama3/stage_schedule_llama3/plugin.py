"""The plugin's hook: the schedule and its option N."""

from stage_core.api import OptionSpec, ScheduleSpec, hookimpl

from .schedules import llama3

SOURCE = "Llama Team, The Llama 3 Herd of Models (arXiv 2407.21783), section 3.3.2 and Figure 6"


@hookimpl
def stage_schedules():
    return [ScheduleSpec(
        "llama3", llama3, "Llama 3's interleaved 1F1B with any number of micro-batches: rounds of N contiguous "
                          "micro-batches through each chunk (--virtual-stages chunks a rank)",
        source=SOURCE,
        options=(OptionSpec("round-size", int, None, "micro-batches a rank runs through one chunk before its next "
                                                     "(Llama 3's N; default: pp)", metavar="N"),))]
