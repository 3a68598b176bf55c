"""The compute models against hand-computed cases, and the fit against known parameters."""

import pytest

from stage_core.api import Gemm, kernel
from stage_core.records import GpuSpec
from stage_hardware.compute import calibrated_time, fit, quantization, roofline_time
from stage_hardware.presets import A100_GPU, H100_GPU

# round numbers: 100 TFLOPS, 1 TB/s, 10 SMs
GPU = GpuSpec(name="t", description="t", matmul_tflops={"bf16": 100.0}, vector_tflops=10.0,
              hbm_gbps=1000.0, sm_count=10, compute_model="calibrated",
              parameters={"gemm_efficiency": 0.8, "gemm_k_half": 64.0, "flash_fwd_efficiency": 0.6,
                          "flash_bwd_efficiency": 0.4, "hbm_efficiency": 0.9, "launch_us": 2.0})


def matmul(m, n, k, batch=1):
    spec, sizes = ("mk,kn->mn", {"m": m, "k": k, "n": n}) if batch == 1 else (
        "bmk,bkn->bmn", {"b": batch, "m": m, "k": k, "n": n})
    f = 2 * batch * m * n * k
    return kernel("einsum", "", "forward", spec, sizes, "bf16", flops=f, matmul_flops=f,
                  nbytes=2 * batch * (m * k + k * n + m * n))


def elementwise(n, flops_per=1):
    return kernel("elementwise", "gelu", "forward", "n->n", {"n": n}, "bf16", flops=flops_per * n,
                  matmul_flops=0, nbytes=4 * n)


def flash(fwd=True, flops=10**12):
    return kernel("fused", "flash_attention" if fwd else "flash_attention_bwd", "forward", "", {}, "bf16",
                  flops=flops, matmul_flops=flops, nbytes=10**6)


def test_roofline_is_datasheet_max():
    k = matmul(1024, 1024, 1024)
    assert roofline_time(k, GPU) == pytest.approx(k.flops / 100e12)
    e = elementwise(10**6)
    assert roofline_time(e, GPU) == pytest.approx(4e6 / 1e12)


def test_quantization_by_hand():
    # 1280 x 2560 output in 128 x 256 tiles: 10 x 10 = 100 tiles on 10 SMs, 10 full waves
    assert quantization(Gemm(1, 1280, 2560, 4096), 10) == (1.0, 1)
    # one row more: 11 x 10 = 110 tiles, 11 waves of 10 for 100 tiles' worth of work (+1 row)
    q, split = quantization(Gemm(1, 1281, 2560, 4096), 10)
    assert (q, split) == (pytest.approx(1281 * 2560 / (11 * 10 * 128 * 256)), 1)
    # a GEMV: one 16 x 256 tile row of 4 tiles; K split in 2 (10 // 4) to fill 8 SMs, one wave
    q, split = quantization(Gemm(1, 1, 1024, 4096), 10)
    assert split == 2 and q == pytest.approx(1 * 1024 * 2 / (1 * 10 * 16 * 256))


def test_a_large_gemm_runs_at_the_efficiency_times_the_k_factor():
    k = matmul(1280, 2560, 4096)
    compute = k.flops / (100e12 * 0.8 * 4096 / (4096 + 64))
    assert calibrated_time(k, GPU) == pytest.approx(2e-6 + compute)


def test_memory_bound_kernels_run_at_achievable_bandwidth():
    e = elementwise(10**7)
    assert calibrated_time(e, GPU) == pytest.approx(2e-6 + 4e7 / 0.9e12)


def test_flash_attention_runs_at_its_own_efficiencies():
    assert calibrated_time(flash(True), GPU) == pytest.approx(2e-6 + 1e12 / 60e12)
    assert calibrated_time(flash(False), GPU) == pytest.approx(2e-6 + 1e12 / 40e12)


@pytest.mark.parametrize("gpu", [A100_GPU, H100_GPU], ids=["a100", "h100"])
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_decode_matmuls_are_memory_bound(gpu, batch):
    # a decode step's projection: `batch` tokens times an 8192 x 8192 bf16 weight
    k = matmul(batch, 8192, 8192)
    memory = k.bytes / (gpu.hbm_gbps * 1e9 * gpu.parameters["hbm_efficiency"])
    assert calibrated_time(k, gpu) == pytest.approx(gpu.parameters["launch_us"] * 1e-6 + memory)


def test_fit_recovers_known_parameters():
    kernels = ([matmul(m, n, k) for m in (256, 2048, 8192) for n in (1024, 4096) for k in (64, 512, 4096)]
               + [matmul(128, 128, 64, batch=b) for b in (16, 256)]
               + [elementwise(n) for n in (10**4, 10**6, 10**8)]
               + [flash(True, f) for f in (10**10, 10**12)] + [flash(False, f) for f in (10**10, 10**12)])
    samples = [(k, calibrated_time(k, GPU)) for k in kernels]
    got = fit(samples, GPU)
    for name, value in GPU.parameters.items():
        assert got[name] == pytest.approx(value, rel=1e-6), name


def test_fit_keeps_what_the_profile_cannot_tell():
    # no attention, every GEMM with K = 1024: neither flash efficiency nor gemm_k_half is fixed
    kernels = [matmul(m, n, 1024) for m in (512, 4096) for n in (1024, 8192)] + [elementwise(10**7)]
    got = fit([(k, calibrated_time(k, GPU)) for k in kernels], GPU)
    assert "flash_fwd_efficiency" not in got and "flash_bwd_efficiency" not in got
    assert got["gemm_k_half"] == 64.0
    assert got["gemm_efficiency"] == pytest.approx(0.8, rel=1e-6)
