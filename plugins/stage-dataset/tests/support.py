"""What these tests register in place of other plugins (only the core and stage-dataset are
installed here): an H100 preset with a roofline compute model, a serial estimator, a
serial executor."""

from __future__ import annotations

import numpy as np

from stage_core import hookimpl
from stage_core.records import ComputeModelSpec, EstimatorSpec, ExecutorSpec, GpuSpec, HardwareSpec, LinkSpec

#: the h100 preset's datasheet numbers (REFERENCE.md 7: 989.4 TFLOPS dense BF16, 3.35 TB/s HBM)
H100 = HardwareSpec(
    name="h100", description="", gpus_per_node=8,
    gpu=GpuSpec(name="h100", description="", matmul_tflops={"bf16": 989.4}, vector_tflops=66.9, hbm_gbps=3350.0,
                sm_count=132),
    scale_up=LinkSpec("NVLink 4", 450.0, 0.9, 936.25), scale_out=LinkSpec("InfiniBand NDR", 50.0, 0.9, 2643.5))


def serial(result, hardware):
    """Each rank class's kernels one after the other in program order, communication free: a
    node starts when the one before it ends; the step is the slowest class's last end."""
    starts, finishes = [], []
    for program in result.job.programs:
        took = np.asarray([n.duration_micros * 1e-6 for n in program.nodes])
        end = np.cumsum(took)
        starts.append(end - took)
        finishes.append(end)
    return {"step_time_s": max(float(f[-1]) for f in finishes), "node_start_s": starts, "node_finish_s": finishes}


def in_order(fn, items, options):
    for i, item in enumerate(items):
        yield i, fn(item)


class Support:
    @hookimpl
    def stage_hardware(self):
        return [H100]

    @hookimpl
    def stage_compute_models(self):
        def roofline(kernel, gpu):
            return max(kernel.flops / gpu.peak_flops(kernel.dtype), kernel.bytes / (gpu.hbm_gbps * 1e9))

        return [ComputeModelSpec(name="roofline", time=roofline)]

    @hookimpl
    def stage_estimators(self):
        return [EstimatorSpec("serial", serial, "kernels one after the other, communication free")]

    @hookimpl
    def stage_executors(self):
        return [ExecutorSpec("in-order", in_order, "one unit after the other, in this process")]
