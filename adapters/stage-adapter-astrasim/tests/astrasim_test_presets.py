"""Hardware records for the adapter's tests (the stage-hardware presets are not installed here)."""

from stage_core.records import GpuSpec, HardwareSpec, LinkSpec

#: ASTRA-sim's validated HGX H100 NVLink: 400 GiB/s of the datasheet's 450 GB/s
EFFICIENCY = 400 * 2**30 / 450e9


def _preset(name, tflops, hbm, nvlink, ib):
    gpu = GpuSpec(name=name, description=f"test {name}", matmul_tflops={"bf16": tflops},
                  vector_tflops=20.0, hbm_gbps=hbm, sm_count=100)
    return HardwareSpec(name=name, description=f"test {name} nodes", gpu=gpu, gpus_per_node=8,
                        scale_up=LinkSpec("NVLink", nvlink, EFFICIENCY, 936.25),
                        scale_out=LinkSpec("IB", ib, EFFICIENCY, 2643.5))


#: datasheet figures of H100 and A100 (the stage-hardware presets carry the sources)
TEST_PRESETS = {"h100": _preset("h100", 989.4, 3350.0, 450.0, 50.0),
                "a100": _preset("a100", 312.0, 2039.0, 300.0, 25.0)}
