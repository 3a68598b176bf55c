"""Compute models: the time of one kernel on one GPU.

``roofline``
    What ASTRA-sim's own roofline does: ``max(FLOPs / peak, bytes / HBM bandwidth)``
    with datasheet figures.  Every matmul runs at peak.

``calibrated``
    A roofline whose two roofs are what real kernels reach, plus a fixed cost per
    kernel::

        time = launch + max(compute, memory)
        memory  = bytes / (HBM bandwidth x hbm_efficiency)
        compute = GEMM:  FLOPs / (peak x gemm_efficiency x quantization x K / (K + gemm_k_half))
                  flash attention: FLOPs / (peak x flash_{fwd,bwd}_efficiency)
                  else: FLOPs / FP32 vector peak

    *quantization* is the useful share of the tile grid (NVIDIA, "Matrix
    Multiplication Background User's Guide", ch. 3, tile and wave quantization): the
    output is cut in tiles of at most 128 x 256 (the guide's most efficient cuBLAS
    tiles), no larger than the problem needs (at least 16, the tensor-core MMA
    size); the tiles run in waves of one per SM.  When the tiles do not fill the
    SMs, K is split among them (split-K, as cuBLAS does for small outputs) while
    each part keeps at least 256 of K.  The K / (K + gemm_k_half) factor is the
    fixed cost of filling and draining each tile's main loop over its part of K.

    All six parameters are the GPU's (:attr:`GpuSpec.parameters`); :func:`fit`
    finds them from measured kernels (``stage calibrate``).
"""

from __future__ import annotations

from math import ceil
from typing import Mapping, Sequence

import numpy as np
from stage_core.api import Gemm, Kernel
from stage_core.records import ComputeModelSpec, GpuSpec

TILE_M, TILE_N = 128, 256  # the larger tile side goes along the larger output dim
MIN_TILE = 16
MIN_SPLIT_K = 256

PARAMETERS: Mapping[str, str] = {
    "gemm_efficiency": "fraction of the dense tensor-core peak a large GEMM reaches (full waves, long K)",
    "gemm_k_half": "K at which the fixed cost of a tile's main loop halves a GEMM's efficiency",
    "flash_fwd_efficiency": "fraction of the tensor-core peak FlashAttention's forward kernel reaches",
    "flash_bwd_efficiency": "fraction of the tensor-core peak FlashAttention's backward kernel reaches",
    "hbm_efficiency": "fraction of the datasheet HBM bandwidth a memory-bound kernel reaches",
    "launch_us": "fixed time per kernel in microseconds (launch, ramp-up, tail)",
}


# --------------------------------------------------------------------------- roofline


def roofline_time(kernel: Kernel, gpu: GpuSpec) -> float:
    """ASTRA-sim's roofline with the datasheet's peak and HBM bandwidth."""
    return max(kernel.flops / gpu.peak_flops(kernel.dtype), kernel.bytes / (gpu.hbm_gbps * 1e9))


# --------------------------------------------------------------------------- calibrated


def _tile(size: int, cap: int) -> int:
    t = MIN_TILE
    while t < size and t < cap:
        t *= 2
    return t


def quantization(g: Gemm, sms: int) -> tuple[float, int]:
    """(useful share of the tile grid's work, split-K factor) of ``g`` on ``sms`` SMs."""
    small, large = sorted((g.m, g.n))
    tm, tn = _tile(small, TILE_M), _tile(large, TILE_N)
    tiles = g.batch * ceil(small / tm) * ceil(large / tn)
    split = 1
    if tiles < sms:
        split = max(1, min(sms // tiles, g.k // MIN_SPLIT_K))
    waves = ceil(tiles * split / sms)
    return g.batch * g.m * g.n * split / (waves * sms * tm * tn), split


def _parts(kernel: Kernel, gpu: GpuSpec) -> tuple[str, float, float, float]:
    """(class, compute feature, second compute feature, memory feature) in seconds at
    efficiency 1: the time is ``launch + max(c1 / eff + c2 * k_half / eff, mem / hbm_eff)``
    for GEMMs, ``launch + max(c1 / eff_class, mem / hbm_eff)`` for the others."""
    memory = kernel.bytes / (gpu.hbm_gbps * 1e9)
    other = (kernel.flops - kernel.matmul_flops) / (gpu.vector_tflops * 1e12)
    peak = gpu.peak_flops(kernel.dtype)
    if kernel.is_flash:
        cls = "flash_fwd" if kernel.fn == "flash_attention" else "flash_bwd"
        return cls, kernel.matmul_flops / peak, other, memory
    g = kernel.gemm()
    if g is not None:
        q, split = quantization(g, gpu.sm_count)
        base = kernel.matmul_flops / (peak * q)
        return "gemm", base, base / (g.k / split), memory
    if kernel.matmul_flops:  # a matmul of unknown shape: the large-GEMM rate
        return "gemm", kernel.matmul_flops / peak, 0.0, memory
    return "memory", 0.0, other, memory


def _compute(cls: str, c1: float, c2: float, p: Mapping[str, float]) -> float:
    if cls == "gemm":
        return (c1 + c2 * p["gemm_k_half"]) / p["gemm_efficiency"]
    if cls == "memory":
        return c2
    return c1 / p[f"{cls}_efficiency"] + c2


def calibrated_time(kernel: Kernel, gpu: GpuSpec) -> float:
    p = gpu.parameters
    cls, c1, c2, mem = _parts(kernel, gpu)
    return p["launch_us"] * 1e-6 + max(_compute(cls, c1, c2, p), mem / p["hbm_efficiency"])


# --------------------------------------------------------------------------- fitting


def fit(samples: Sequence[tuple[Kernel, float]], gpu: GpuSpec, rounds: int = 20) -> dict[str, float]:
    """The calibrated model's parameters that best explain measured kernels.

    Each sample is a kernel and its measured seconds.  Given which roof bounds each
    kernel, the time is linear in (launch, 1/gemm_efficiency,
    gemm_k_half/gemm_efficiency, 1/flash_fwd_efficiency, 1/flash_bwd_efficiency,
    1/hbm_efficiency): one weighted least-squares solve (weights 1/time, so every
    kernel counts by its relative error).  Start from each kernel's class (GEMMs and
    attention compute-bound, the rest memory-bound), then move each kernel to the
    roof the fitted model says bounds it, until nothing moves.

    Returns only the parameters the samples determine: a profile without attention
    kernels says nothing about flash efficiency, and one whose GEMMs all share one K
    cannot separate gemm_k_half from gemm_efficiency (gemm_k_half then stays
    ``gpu``'s).  Raises ValueError when the samples are empty.
    """
    rows = [(_parts(k, gpu), t) for k, t in samples if t > 0]
    if not rows:
        raise ValueError("no kernel with a positive duration to fit")
    names = ["launch_us", "gemm_efficiency", "gemm_k_half", "flash_fwd_efficiency", "flash_bwd_efficiency",
             "hbm_efficiency"]
    column = {"gemm": 1, "flash_fwd": 3, "flash_bwd": 4}
    k_half = float(gpu.parameters.get("gemm_k_half", 0.0))
    bound = ["compute" if cls != "memory" else "memory" for (cls, *_), _ in rows]
    params: dict[str, float] = {}
    for _ in range(rounds):
        a = np.zeros((len(rows), 6))
        y = np.array([1.0] * len(rows))
        for i, ((cls, c1, c2, mem), t) in enumerate(rows):
            a[i, 0] = 1e-6
            if bound[i] == "memory":
                a[i, 5] = mem
            elif cls == "gemm":
                a[i, 1], a[i, 2] = c1, c2
            else:
                a[i, column[cls]] = c1
                y[i] -= c2 / t
            a[i, :] /= t
        used = [j for j in range(6) if a[:, j].any()]
        separable = 2 in used and np.linalg.matrix_rank(a[:, used]) == len(used)
        if 2 in used and not separable:  # one K for every GEMM: keep gemm_k_half, fit the efficiency
            a[:, 1] += a[:, 2] * k_half
            used.remove(2)
        x = np.zeros(6)
        x[used] = np.linalg.lstsq(a[:, used], y, rcond=None)[0]
        params = {"launch_us": float(x[0])}
        for j in used:
            if j in (1, 3, 4, 5):
                params[names[j]] = float(1 / x[j]) if x[j] > 0 else float("nan")
        if 1 in used:
            params["gemm_k_half"] = float(x[2] / x[1]) if separable else k_half
        full = {**gpu.parameters, **params}
        moved = False
        for i, ((cls, c1, c2, mem), _) in enumerate(rows):
            if cls == "memory" or "hbm_efficiency" not in full:
                continue
            now = "memory" if mem / full["hbm_efficiency"] > _compute(cls, c1, c2, full) else "compute"
            if now != bound[i]:
                bound[i], moved = now, True
        if not moved:
            break
    return params


def fitted_by(samples: Sequence[tuple[Kernel, float]], gpu: GpuSpec, params: Mapping[str, float]
              ) -> dict[str, dict[str, int]]:
    """Which kernels determine each parameter :func:`fit` returned: {parameter: {kernel
    class: count}}, each kernel counted under the roof the fitted model bounds it by
    (``hbm_efficiency``: the memory-bound ones, GEMMs the fit moved there included;
    ``launch_us``: every kernel).  What a refusal of an impossible parameter names."""
    full = {**gpu.parameters, **params}
    out: dict[str, dict[str, int]] = {}

    def count(name: str, cls: str) -> None:
        if name in params:
            out.setdefault(name, {})
            out[name][cls] = out[name].get(cls, 0) + 1

    for k, t in samples:
        if not t > 0:
            continue
        cls, c1, c2, mem = _parts(k, gpu)
        label = {"gemm": "gemm", "flash_fwd": "flash_attention", "flash_bwd": "flash_attention_bwd"}.get(
            cls, "memory-bound")
        count("launch_us", label)
        try:
            memory_bound = cls == "memory" or mem / full["hbm_efficiency"] > _compute(cls, c1, c2, full)
        except (KeyError, ZeroDivisionError, ValueError):
            memory_bound = cls == "memory"
        if memory_bound:
            count("hbm_efficiency", label)
        elif cls == "gemm":
            count("gemm_efficiency", label)
            count("gemm_k_half", label)
        else:
            count(f"{cls}_efficiency", label)
    return out


ROOFLINE = ComputeModelSpec(
    name="roofline", time=roofline_time,
    description="ASTRA-sim's roofline: max(FLOPs / datasheet peak, bytes / datasheet HBM bandwidth)")

CALIBRATED = ComputeModelSpec(
    name="calibrated", time=calibrated_time, parameters=PARAMETERS, fit=fit,
    description="roofline of achieved rates: GEMM efficiency with tile and wave quantization and a K-loop "
                "cost, FlashAttention forward and backward efficiency, achievable HBM bandwidth, and a fixed "
                "cost per kernel")


# --------------------------------------------------------------------------- CPU nodes (Das et al. 2016)

CPU_PARAMETERS: Mapping[str, str] = {
    "matmul_efficiency": "fraction of the node's fp32 FMA peak convolutions and matrix products reach",
    "vector_efficiency": "fraction of the peak elementwise, normalization and pooling kernels reach",
    "memory_efficiency": "fraction of the DDR bandwidth a memory-bound kernel reaches",
    "launch_us": "fixed time per kernel in microseconds (a parallel region's fork and join)",
}


def cpu_time(kernel: Kernel, gpu: GpuSpec) -> float:
    """A CPU node's roofline: launch + max(matmul FLOPs at the peak x matmul_efficiency plus the
    other FLOPs at the peak x vector_efficiency, bytes at the memory bandwidth x memory_efficiency)."""
    p = gpu.parameters
    peak = gpu.vector_tflops * 1e12
    compute = kernel.matmul_flops / (peak * p["matmul_efficiency"])
    compute += (kernel.flops - kernel.matmul_flops) / (peak * p["vector_efficiency"])
    memory = kernel.bytes / (gpu.hbm_gbps * 1e9 * p["memory_efficiency"])
    return p["launch_us"] * 1e-6 + max(compute, memory)


CPU = ComputeModelSpec(name="cpu", time=cpu_time, parameters=CPU_PARAMETERS,
                       description="a CPU node's roofline: FMA peak x efficiency, DDR bandwidth x efficiency, "
                                   "a fixed cost per kernel")
