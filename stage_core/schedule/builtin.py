"""The core's built-in schedules, registered like any plugin."""

from ..hookspecs import hookimpl
from ..records import ScheduleSpec
from .orders import gpipe, interleaved_1f1b, one_f_one_b


@hookimpl(trylast=True)
def stage_schedules():
    return [
        ScheduleSpec("gpipe", gpipe, "all forwards, then all backwards", chunks=1,
                     source="Huang et al. 2019, GPipe"),
        ScheduleSpec("1f1b", one_f_one_b, "one forward, one backward (PipeDream-flush)", chunks=1,
                     source="Narayanan et al. 2021, PipeDream-2BW / Megatron-LM"),
        ScheduleSpec("interleaved", interleaved_1f1b, "interleaved 1F1B with virtual stages",
                     source="Narayanan et al. 2021, section 2.2"),
    ]
