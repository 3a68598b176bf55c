"""1F1B whose weight gradients run one backward late (after the next micro-batch's B), written
against STAGE's documented step kinds: F, B (input gradients) and W (weight gradients)."""

from stage_core.api import ScheduleSpec, hookimpl


def order(stages, micro_batches, virtual=1):
    out = []
    for i in range(stages):
        warm = min(stages - i - 1, micro_batches)
        steps = [("F", k, 0) for k in range(warm)]
        for k in range(micro_batches):
            if warm + k < micro_batches:
                steps.append(("F", warm + k, 0))
            steps.append(("B", k, 0))
            if k:
                steps.append(("W", k - 1, 0))
        steps.append(("W", micro_batches - 1, 0))
        out.append(steps)
    return out


@hookimpl
def stage_schedules():
    return [ScheduleSpec("lagged-1f1b", order, "1F1B with each W one backward late", chunks=1)]
