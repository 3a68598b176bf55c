"""Every preset against STAGE's conformance kit: sourced figures, a compute model no faster than the roofline."""

import pytest
from stage_core.testing import assert_hardware_preset, fresh_host

from stage_hardware import plugin

HOST = fresh_host((plugin, "hardware"))


@pytest.mark.parametrize("name", [h.name for h in HOST.hardware()])
def test_presets(name):
    times = assert_hardware_preset(HOST, name)
    # an 8192^3 bf16 GEMM (1.1e12 FLOPs) on an A100 (312 TFLOP/s) or an H100 (989 TFLOP/s): at least the peak's time
    assert times["gemm8192"] >= 2 * 8192 ** 3 / (HOST.hardware_preset(name).gpu.peak_flops("bf16"))
