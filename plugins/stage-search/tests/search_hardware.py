"""Hardware for these tests (no hardware plugin is installed in this distribution's env)."""

from stage_core import hookimpl
from stage_core.records import ComputeModelSpec, GpuSpec, HardwareSpec, LinkSpec

#: the h100 preset's numbers (stage-hardware), here so that these tests need no other plugin
H100 = HardwareSpec(
    name="h100", description="", gpus_per_node=8,
    gpu=GpuSpec(name="h100", description="", matmul_tflops={"bf16": 989.4}, vector_tflops=66.9, hbm_gbps=3350.0,
                sm_count=132),
    scale_up=LinkSpec("NVLink 4", 450.0, 400 * 2**30 / 450e9, 936.25),
    scale_out=LinkSpec("InfiniBand NDR", 50.0, 400 * 2**30 / 450e9, 2643.5))


class Hardware:
    """The h100 preset and a roofline compute model (no hardware plugin is installed here)."""

    @hookimpl
    def stage_hardware(self):
        return [H100]

    @hookimpl
    def stage_compute_models(self):
        def roofline(kernel, gpu):
            return max(kernel.flops / gpu.peak_flops(kernel.dtype), kernel.bytes / (gpu.hbm_gbps * 1e9))

        return [ComputeModelSpec(name="roofline", time=roofline)]
