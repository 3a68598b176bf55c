"""The presets give back the published figures they were derived from."""

import pytest

import dataclasses
from pathlib import Path

from stage_core.api import hardware, kernel
from stage_hardware import shaped, tables
from stage_hardware.compute import PARAMETERS, calibrated_time
from stage_hardware.presets import (CALIBRATED_PRESETS, IB_LATENCY_NS, MAMF_GEMM, MEASURED_LINKS, NVLINK_LATENCY_NS,
                                    PRESETS, SHAPED_FIT)

BY_NAME = {p.name: p for p in PRESETS}
CALIBRATED = {p.name.removesuffix("-calibrated"): p for p in CALIBRATED_PRESETS}
DATA = Path(__file__).parents[1] / "data"


def matmul(m, n, k):
    return kernel("einsum", "", "forward", "mk,kn->mn", {"m": m, "k": k, "n": n}, "bf16",
                  flops=2 * m * n * k, matmul_flops=2 * m * n * k, nbytes=2 * (m * k + k * n + m * n))


# stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS"
MAMF = [
    ("a100", (6912, 16384, 2048), 267.9),
    ("a100", (1024, 10240, 5120), 271.2),
    ("h100", (6144, 17920, 2816), 792.1),
    ("h100", (2048, 2048, 13312), 794.5),
]


@pytest.mark.parametrize("name,shape,tflops", MAMF)
def test_the_calibrated_model_gives_the_published_matmul_rates(name, shape, tflops):
    efficiency, k_half = MAMF_GEMM[name]
    gpu = CALIBRATED[name].gpu
    gpu = dataclasses.replace(gpu, parameters={**gpu.parameters, "gemm_efficiency": efficiency,
                                               "gemm_k_half": k_half})
    assert gpu.parameters["gemm_k_half"] == CALIBRATED[name].gpu.parameters["gemm_k_half"]
    k = matmul(*shape)
    launch = gpu.parameters["launch_us"] * 1e-6  # the benchmark times back-to-back calls
    achieved = k.flops / (calibrated_time(k, gpu) - launch) / 1e12
    assert achieved == pytest.approx(tflops, rel=0.005)


def test_every_parameter_is_there_with_a_source():
    for preset in (*PRESETS, *CALIBRATED_PRESETS):
        gpu = preset.gpu
        model = {"shaped": shaped.PARAMETERS, "calibrated": PARAMETERS}[gpu.compute_model]
        assert set(gpu.parameters) == set(model), preset.name
        for key in [*model, "matmul_tflops", "vector_tflops", "hbm_gbps", "sm_count"]:
            assert gpu.sources.get(key), (preset.name, key)
        for key in ("scale_up", "scale_out", "efficiency", "latency_ns"):
            assert preset.sources.get(key), (preset.name, key)


def test_datasheet_figures():
    a100, h100 = BY_NAME["a100"], BY_NAME["h100"]
    assert (a100.gpu.peak_flops("bf16"), a100.gpu.hbm_gbps, a100.gpu.sm_count) == (312e12, 2039.0, 108)
    assert (h100.gpu.peak_flops("bf16"), h100.gpu.hbm_gbps, h100.gpu.sm_count) == (989.4e12, 3350.0, 132)
    assert [(p.scale_up.bandwidth_gbps, p.scale_out.bandwidth_gbps) for p in PRESETS] == [(300, 25), (450, 50)]
    assert [(p.scale_up.bandwidth_gbps, p.scale_out.bandwidth_gbps) for p in CALIBRATED_PRESETS] == [(300, 25),
                                                                                                    (450, 50)]


def test_h100_calibrated_nvlink_is_astra_sims_validated_configuration():
    # HGX-H100-validated.yml: 400 (GB of 2^30 bytes per second), 936.25 ns: the old preset's links
    link = CALIBRATED["h100"].scale_up
    assert link.bytes_per_second / 2**30 == pytest.approx(400.0)
    assert link.latency_ns == NVLINK_LATENCY_NS == 936.25
    assert IB_LATENCY_NS == pytest.approx(936.25 * 9.6 / 3.4, abs=0.05)


@pytest.mark.parametrize("name", ["a100", "h100"])
def test_the_presets_kernel_parameters_are_the_fit_of_the_measured_tables(name):
    """The shaped presets' GEMM, memory and per-kernel numbers are what `stage calibrate` fits to the
    stored measured kernel times (vidur's), to the four digits the preset keeps; nothing fits a step."""
    points = tables.read_kernels(DATA / f"{name}-kernels.csv")
    fitted = shaped.fit([(p.kernel, p.seconds) for p in points], BY_NAME[name].gpu)
    assert set(fitted) == set(SHAPED_FIT[name])
    for key, value in SHAPED_FIT[name].items():
        assert fitted[key] == pytest.approx(value, rel=5e-4), key
        assert BY_NAME[name].gpu.parameters[key] == value
    assert BY_NAME[name].gpu.compute_model == "shaped"
    # the old presets keep the calibrated model and its step-fitted GEMM efficiency by name
    assert CALIBRATED[name].gpu.compute_model == "calibrated"
    assert CALIBRATED["a100"].gpu.parameters["gemm_efficiency"] == 0.664


def test_presets_survive_a_hardware_file(tmp_path):
    for preset in (*PRESETS, *CALIBRATED_PRESETS):
        path = tmp_path / f"{preset.name}.json"
        hardware.save(preset, path)
        assert hardware.load(path) == preset


def test_the_presets_links_are_the_fit_of_the_measured_nccl_tables():
    """The a100's NVLink and the h100's NVLink and InfiniBand efficiency and latency are what `stage
    calibrate` fits (ASTRA-sim's analytical network, the core's netmodel) to vidur's NCCL times; the a100's
    InfiniBand takes the h100's (vidur's A100 nodes share one port: data/README.md)."""
    from stage_hardware import links

    for name, tiers in (("h100", ("scale_up", "scale_out")), ("a100", ("scale_up",))):
        points = [p for p in tables.read_collectives(DATA / f"{name}-collectives.csv")
                  if tiers == ("scale_up", "scale_out") or p.ranks == p.ranks_per_node]
        fitted, _ = links.fit(BY_NAME[name], points)
        for tier in tiers:
            link = getattr(fitted, tier)
            assert (link.efficiency, link.latency_ns) == MEASURED_LINKS[name][tier], (name, tier)
            assert getattr(BY_NAME[name], tier).efficiency == MEASURED_LINKS[name][tier][0]
    assert MEASURED_LINKS["a100"]["scale_out"] == MEASURED_LINKS["h100"]["scale_out"]
    assert BY_NAME["a100"].scale_out.bandwidth_gbps == 25.0  # HDR per GPU, the DGX A100's datasheet
