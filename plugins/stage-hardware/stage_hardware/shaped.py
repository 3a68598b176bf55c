"""The ``shaped`` compute model: a kernel's time from its shapes, fitted to measured kernels.

::

    time = launch + max(compute, memory)
    memory = bytes / (HBM bandwidth x hbm_efficiency)

**GEMMs** (a contraction read off its einsum as ``batch`` products [m, k] x [k, n]).
cuBLAS cuts the output into tiles, one thread block per tile, and runs them in waves of
one block per SM (NVIDIA, "Matrix Multiplication Background User's Guide": tile and
wave quantization).  For each candidate tile (256x128, 128x128, 128x64, 64x64, 64x32 and
32x32, either way round) the time is::

    waves x 2 tm tn (k / split + gemm_k_half) (1 + gemm_tile_cost x 64 (1/tm + 1/tn))
          / (peak / SMs x gemm_efficiency)

and the fastest candidate is the one taken (cuBLAS's heuristics choose among such
kernels).  ``gemm_k_half`` is the fixed cost of filling and draining a tile's main loop,
in iterations of K; ``gemm_tile_cost`` what a smaller tile loses by loading more operand
bytes per multiply-add (0: none).  When the tiles do not fill the SMs, K is split among
them (split-K) while each part keeps at least 256 of K.

**Fused attention** (FlashAttention-2's work decomposition, Dao 2023): the forward runs
a thread block per 128 queries of one head, the backward one per 128 keys; a block's
work is the scores it computes (with a causal mask, only those at or below the
diagonal: the kernel skips the rest whatever convention its FLOPs are counted in).  The
blocks run over the SMs, so the time is the larger of the total work over the SMs and
the largest block's work, at 4 (forward: Q·Kᵀ and P·V) or 10 (backward: five products)
FLOPs per score and head dimension, at ``flash_fwd_efficiency`` or
``flash_bwd_efficiency`` of the per-SM peak.

**Everything else** is its bytes at the achievable bandwidth (``hbm_efficiency`` of the
datasheet's; a normalization, which reduces each row before it scales it,
``norm_efficiency``), and its non-matmul FLOPs at the FP32 vector peak (added to a GEMM's
or an attention's compute).

:func:`fit` finds the parameters from measured kernels (``stage calibrate``): the two
nonlinear GEMM parameters on a grid, the others, given them, by weighted least squares
(every kernel counts by its relative error).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from stage_core.api import Kernel
from stage_core.records import ComputeModelSpec, GpuSpec

#: candidate GEMM tiles (rows, columns); each is also tried the other way round
TILES = ((256, 128), (128, 128), (128, 64), (64, 64), (64, 32), (32, 32))
TILE_COST_UNIT = 64  # gemm_tile_cost is per 64 of 1/tm + 1/tn
MIN_SPLIT_K = 256
FLASH_BLOCK = 128  # FlashAttention-2's block of queries (forward) or keys (backward)
#: FLOPs per score and head-dimension element: forward Q·Kᵀ and P·V, backward five products
FLASH_FLOPS = {"flash_attention": 4, "flash_attention_bwd": 10}

PARAMETERS: Mapping[str, str] = {
    "gemm_efficiency": "fraction of the per-SM tensor-core peak a GEMM tile's main loop reaches",
    "gemm_k_half": "fixed cost of filling and draining a GEMM tile's main loop, in iterations of K",
    "gemm_tile_cost": "what a smaller GEMM tile loses per multiply-add by loading more operand bytes "
                      "(x 64 (1/rows + 1/columns))",
    "flash_fwd_efficiency": "fraction of the per-SM tensor-core peak FlashAttention's forward blocks reach",
    "flash_bwd_efficiency": "fraction of the per-SM tensor-core peak FlashAttention's backward blocks reach",
    "hbm_efficiency": "fraction of the datasheet HBM bandwidth an elementwise (memory-bound) kernel reaches",
    "norm_efficiency": "fraction of the datasheet HBM bandwidth a normalization kernel reaches",
    "launch_us": "fixed time per kernel in microseconds (ramp-up and tail of the kernel)",
}

#: the grid :func:`fit` searches for the two nonlinear GEMM parameters
K_HALF_GRID = (0.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0)
TILE_COST_GRID = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0)


# --------------------------------------------------------------------------- GEMMs


def gemm_base(batch, m, n, k, sms: int, peak: float, k_half: float, tile_cost: float):
    """Seconds of GEMMs at ``gemm_efficiency`` 1 (arrays or numbers): the fastest tile's
    waves.  ``peak`` is the whole GPU's FLOPs per second."""
    batch, m, n, k = (np.asarray(x, dtype=np.float64) for x in (batch, m, n, k))
    per_sm = peak / sms
    best = np.full(np.broadcast(batch, m, n, k).shape, np.inf)
    for rows, cols in TILES:
        for tm, tn in {(rows, cols), (cols, rows)}:
            tiles = batch * np.ceil(m / tm) * np.ceil(n / tn)
            split = np.where(tiles < sms, np.maximum(1, np.minimum(sms // np.maximum(tiles, 1),
                                                                    k // MIN_SPLIT_K)), 1)
            waves = np.ceil(tiles * split / sms)
            loss = 1 + tile_cost * TILE_COST_UNIT * (1 / tm + 1 / tn)
            best = np.minimum(best, waves * 2 * tm * tn * (k / split + k_half) * loss / per_sm)
    return best


# --------------------------------------------------------------------------- attention


def flash_shape(kernel: Kernel) -> tuple[int, int, int, int] | None:
    """(batch x heads, queries, keys, FLOPs per score) of a fused attention kernel
    (``GraphBuilder.flash_attention``'s letters), or None when its letters are others."""
    size = kernel.letters
    if not {"b", "s", "k", "g", "d"} <= set(size):
        return None
    heads = size["b"] * size["g"] * size.get("r", 1)
    d, v = size["d"], size.get("v", size["d"])
    if kernel.fn == "flash_attention":
        per_score = 2 * (d + v)
    else:
        per_score = 2 * (3 * d + 2 * v)
    return heads, size["s"], size["k"], per_score


def flash_work(heads: int, queries: int, keys: int, causal: bool, backward: bool, sms: int) -> float:
    """Scores per SM on the critical path: the larger of all blocks' scores over the SMs
    and the largest block's (FlashAttention-2: a block per 128 queries forward, per 128
    keys backward).  A causal mask keeps query i's keys up to ``keys - queries + i``."""
    offset = keys - queries  # keys already cached before the first query (0 in training)
    if backward:
        starts = np.arange(0, keys, FLASH_BLOCK)
        width = np.minimum(FLASH_BLOCK, keys - starts)
        if causal:  # key j is seen by the queries from j - offset on
            seen = queries - np.clip(np.arange(keys) - offset, 0, queries)
            per_block = np.add.reduceat(seen, starts)
        else:
            per_block = width * queries
    else:
        starts = np.arange(0, queries, FLASH_BLOCK)
        height = np.minimum(FLASH_BLOCK, queries - starts)
        if causal:  # rows i..i+h-1 see keys up to offset + i + h (summed row by row)
            per_block = height * (offset + starts) + height * (height + 1) / 2
            per_block = np.minimum(per_block, height * keys)
        else:
            per_block = height * keys
    total = heads * float(per_block.sum())
    return max(total / sms, float(per_block.max()))


# --------------------------------------------------------------------------- the model

EFFICIENCY = {"gemm": "gemm_efficiency", "flash_fwd": "flash_fwd_efficiency", "flash_bwd": "flash_bwd_efficiency"}
LABEL = {"gemm": "gemm", "flash_fwd": "flash_attention", "flash_bwd": "flash_attention_bwd", "memory": "memory-bound",
         "norm": "normalization"}


def _parts(kernel: Kernel, gpu: GpuSpec, k_half: float, tile_cost: float) -> tuple[str, float, float, float, str]:
    """(class, compute at efficiency 1, vector compute, memory at efficiency 1, the memory
    efficiency's name), seconds.  Classes: gemm, flash_fwd, flash_bwd (compute at their
    efficiency, or memory-bound), memory and norm (memory-bound)."""
    memory = kernel.bytes / (gpu.hbm_gbps * 1e9)
    vector = (kernel.flops - kernel.matmul_flops) / (gpu.vector_tflops * 1e12)
    bandwidth = "norm_efficiency" if kernel.kind == "norm" else "hbm_efficiency"
    peak = gpu.peak_flops(kernel.dtype)
    if kernel.is_flash:
        cls = "flash_fwd" if kernel.fn == "flash_attention" else "flash_bwd"
        shape = flash_shape(kernel)
        if shape is None:
            return cls, kernel.matmul_flops / peak, vector, memory, bandwidth
        heads, queries, keys, per_score = shape
        work = flash_work(heads, queries, keys, kernel.causal, cls == "flash_bwd", gpu.sm_count)
        return cls, work * per_score / (peak / gpu.sm_count), vector, memory, bandwidth
    g = kernel.gemm()
    if g is not None:
        base = float(gemm_base(g.batch, g.m, g.n, g.k, gpu.sm_count, peak, k_half, tile_cost))
        return "gemm", base, vector, memory, bandwidth
    if kernel.matmul_flops:  # a matmul of unknown shape: the large-GEMM rate
        return "gemm", kernel.matmul_flops / peak, vector, memory, bandwidth
    return ("norm" if kernel.kind == "norm" else "memory"), 0.0, vector, memory, bandwidth


def _time(parts: tuple[str, float, float, float, str], p: Mapping[str, float]) -> tuple[float, bool]:
    """(seconds, whether memory bounds it) of a kernel's parts under parameters ``p``."""
    cls, base, vector, memory, bandwidth = parts
    compute = vector + (base / p[EFFICIENCY[cls]] if cls in EFFICIENCY else 0.0)
    moving = memory / p[bandwidth]
    return p["launch_us"] * 1e-6 + max(compute, moving), moving > compute or cls not in EFFICIENCY


def shaped_time(kernel: Kernel, gpu: GpuSpec) -> float:
    p = gpu.parameters
    return _time(_parts(kernel, gpu, p["gemm_k_half"], p["gemm_tile_cost"]), p)[0]


# --------------------------------------------------------------------------- fitting

_LINEAR = ("launch_us", "gemm_efficiency", "flash_fwd_efficiency", "flash_bwd_efficiency", "hbm_efficiency",
           "norm_efficiency")
_COLUMN = {name: i for i, name in enumerate(_LINEAR)}


def _linear_fit(parts: list[tuple], seconds: np.ndarray, start: Mapping[str, float],
                rounds: int = 20) -> tuple[dict[str, float], np.ndarray]:
    """launch and the efficiencies, given each kernel's parts: a weighted least-squares
    solve per assignment of kernels to roofs (compute or memory), moved to the roof the
    fitted model says until nothing moves.  Returns the parameters the samples
    determine and the predicted seconds."""
    n = len(seconds)
    rows = np.arange(n)
    compute_col = np.array([_COLUMN[EFFICIENCY[c]] if c in EFFICIENCY else 0 for c, *_ in parts])
    memory_col = np.array([_COLUMN[p[4]] for p in parts])
    base = np.array([p[1] for p in parts])
    vector = np.array([p[2] for p in parts])
    memory = np.array([p[3] for p in parts])
    only_memory = compute_col == 0
    bound = only_memory.copy()  # start: GEMMs and attention compute-bound
    params: dict[str, float] = {}
    predicted = np.zeros(n)
    for _ in range(rounds):
        a = np.zeros((n, len(_LINEAR)))
        a[:, 0] = 1e-6
        a[rows[bound], memory_col[bound]] = memory[bound]
        a[rows[~bound], compute_col[~bound]] = base[~bound]
        y = np.where(bound, 1.0, 1.0 - vector / seconds)
        a /= seconds[:, None]
        used = [j for j in range(len(_LINEAR)) if a[:, j].any()]
        x = np.zeros(len(_LINEAR))
        x[used] = np.linalg.lstsq(a[:, used], y, rcond=None)[0]
        params = {"launch_us": float(x[0])}
        for j in used[1:]:
            params[_LINEAR[j]] = float(1 / x[j]) if x[j] > 0 else float("nan")
        full = {**start, **params}
        inverse = np.array([0.0] + [1 / full[name] if full[name] else np.inf for name in _LINEAR[1:]])
        with np.errstate(invalid="ignore", divide="ignore"):
            compute = vector + np.where(only_memory, 0.0, base * inverse[compute_col])
            moving = memory * inverse[memory_col]
        predicted = full["launch_us"] * 1e-6 + np.maximum(compute, moving)
        now = only_memory | (moving > compute)
        if (now == bound).all():
            break
        bound = now
    return params, predicted


def fit(samples: Sequence[tuple[Kernel, float]], gpu: GpuSpec) -> dict[str, float]:
    """The shaped model's parameters that best explain measured ``(kernel, seconds)``.

    ``gemm_k_half`` and ``gemm_tile_cost`` are searched on a grid
    (:data:`K_HALF_GRID` x :data:`TILE_COST_GRID`), keeping the pair whose least-squares
    fit of the others has the smallest mean relative error among those whose
    efficiencies a GPU can have (at most 1).  Returns only the
    parameters the samples determine: no attention kernel says nothing of
    ``flash_*_efficiency``; GEMMs of one K cannot separate ``gemm_k_half`` from the
    efficiency, nor GEMMs of one output shape ``gemm_tile_cost`` (the GPU's values are
    kept).  Raises ValueError when no sample has a positive time.
    """
    kept = [(k, t) for k, t in samples if t > 0]
    if not kept:
        raise ValueError("no kernel with a positive duration to fit")
    start = {**DEFAULTS, **gpu.parameters}
    seconds = np.array([t for _, t in kept])
    parts = [_parts(k, gpu, 0.0, 0.0) for k, _ in kept]
    gemms = [i for i, (k, _) in enumerate(kept) if parts[i][0] == "gemm" and k.gemm() is not None]
    shapes = np.array([[g.batch, g.m, g.n, g.k] for g in (kept[i][0].gemm() for i in gemms)], dtype=float)
    peaks = np.array([gpu.peak_flops(kept[i][0].dtype) for i in gemms])
    free_k = len(gemms) > 2 and len(set(shapes[:, 3])) > 1
    free_tile = len(gemms) > 2 and len({(m, n) for _, m, n, _ in shapes}) > 1
    best = None
    for k_half in K_HALF_GRID if free_k else (start["gemm_k_half"],):
        for tile_cost in TILE_COST_GRID if free_tile else (start["gemm_tile_cost"],):
            trial = list(parts)
            if gemms:
                bases = gemm_base(shapes[:, 0], shapes[:, 1], shapes[:, 2], shapes[:, 3], gpu.sm_count, peaks,
                                  k_half, tile_cost)
                for i, b in zip(gemms, bases):
                    trial[i] = ("gemm", float(b), *parts[i][2:])
            params, predicted = _linear_fit(trial, seconds, {**start, "gemm_k_half": k_half,
                                                             "gemm_tile_cost": tile_cost})
            score = float(np.mean(np.abs(predicted / seconds - 1)))
            possible = all(0 < v <= 1 for name, v in params.items() if name.endswith("_efficiency"))
            score = (not possible, score)  # a GPU cannot beat its datasheet: such fits only if nothing else
            if best is None or score < best[0]:
                best = (score, k_half, tile_cost, params)
    _, k_half, tile_cost, params = best
    if "gemm_efficiency" in params:
        if free_k:
            params["gemm_k_half"] = k_half
        if free_tile:
            params["gemm_tile_cost"] = tile_cost
    return params


def fitted_by(samples: Sequence[tuple[Kernel, float]], gpu: GpuSpec, params: Mapping[str, float]
              ) -> dict[str, dict[str, int]]:
    """Which kernels determine each fitted parameter: {parameter: {kernel class: count}},
    each kernel counted under the roof the fitted model bounds it by (what a refusal
    of an impossible parameter names)."""
    full = {**DEFAULTS, **gpu.parameters, **params}
    out: dict[str, dict[str, int]] = {}

    def count(name: str, label: str) -> None:
        if name in params:
            out.setdefault(name, {})
            out[name][label] = out[name].get(label, 0) + 1

    for k, t in samples:
        if not t > 0:
            continue
        parts = _parts(k, gpu, full["gemm_k_half"], full["gemm_tile_cost"])
        label = LABEL[parts[0]]
        count("launch_us", label)
        try:
            memory_bound = _time(parts, full)[1]
        except (KeyError, ZeroDivisionError, ValueError):
            memory_bound = parts[0] not in EFFICIENCY
        if memory_bound:
            count(parts[4], label)
        else:
            for name in (EFFICIENCY[parts[0]], *(("gemm_k_half", "gemm_tile_cost") if parts[0] == "gemm" else ())):
                count(name, label)
    return out


#: what a fit starts from when the GPU does not name a parameter
DEFAULTS: Mapping[str, float] = {"gemm_k_half": 0.0, "gemm_tile_cost": 0.0, "gemm_efficiency": 1.0,
                                 "flash_fwd_efficiency": 1.0, "flash_bwd_efficiency": 1.0, "hbm_efficiency": 1.0,
                                 "norm_efficiency": 1.0, "launch_us": 0.0}


SHAPED = ComputeModelSpec(
    name="shaped", time=shaped_time, parameters=PARAMETERS, fit=fit,
    description="kernels by shape: GEMM tiles and waves over the SMs with split-K and a K-loop cost, "
                "FlashAttention blocks by sequence, heads and head size (a causal mask's skipped half left out), "
                "memory-bound kernels at achievable bandwidth, a fixed cost per kernel; fitted to measured "
                "kernel times")
