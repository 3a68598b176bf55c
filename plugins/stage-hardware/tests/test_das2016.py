"""Das et al. 2016's CPU clusters: datasheet arithmetic and the cpu compute model by hand."""

from stage_core.api import kernel
from stage_core.testing import assert_hardware_preset, fresh_host

import stage_hardware.plugin as hw_plugin
from stage_hardware.compute import cpu_time
from stage_hardware.das2016 import PRESETS, XEON

HOST = fresh_host((hw_plugin, "hardware"))


def test_presets_pass_the_kit_and_their_datasheet_arithmetic():
    for name in ("das2016-fdr", "das2016-aws"):
        assert_hardware_preset(HOST, name)
    assert XEON.vector_tflops == 2 * 14 * 2.6 * 32 / 1000  # 2.3296 TFLOP/s fp32
    assert XEON.hbm_gbps == 136.0  # 2 x 68 GB/s
    fdr, aws = (p.scale_out for p in PRESETS)
    assert round(fdr.bandwidth_gbps, 4) == round(56 * 64 / 66 / 8, 4) == 6.7879  # FDR 4x data rate
    assert aws.bandwidth_gbps == 1.25  # 10 Gb/s


def test_cpu_model_by_hand():
    p = XEON.parameters
    n = 4096
    gemm = kernel("einsum", "", "forward", "mk,kn->mn", {"m": n, "k": n, "n": n}, "fp32",
                  flops=2 * n ** 3, matmul_flops=2 * n ** 3, nbytes=3 * n * n * 4)
    assert cpu_time(gemm, XEON) == p["launch_us"] * 1e-6 + 2 * n ** 3 / (2.3296e12 * p["matmul_efficiency"])
    copy = kernel("elementwise", "relu", "forward", "n->n", {"n": 10 ** 8}, "fp32", flops=10 ** 8, matmul_flops=0,
                  nbytes=8 * 10 ** 8)
    assert cpu_time(copy, XEON) == p["launch_us"] * 1e-6 + 8e8 / (136e9 * p["memory_efficiency"])
