"""The A100 and H100 presets: datasheet figures, network tiers, compute-model parameters.

Every number has its source in the record (``sources``); the longer derivations are
here.

Network tiers
-------------
``bandwidth_gbps`` is the datasheet figure per GPU and direction (10^9 B/s):
NVLink 3 600 GB/s total = 300 per direction (A100), NVLink 4 900 = 450 (H100);
InfiniBand HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s, one port per GPU in DGX
A100 and DGX H100.  ``efficiency`` is what a large collective reaches of it:
ASTRA-sim ships a network configuration calibrated against a real HGX H100
(``examples/network/analytical/HGX-H100-validated.yml``: 400.0 in its GB/s of 2^30
bytes, on the 450 GB/s NVLink 4), i.e. 400 x 2^30 / 450e9 = 0.9544; the same factor is
assumed for the other links, which have no validated configuration.
Latency per hop: the validated NVLink figure (936.25 ns); across nodes it is scaled by
NCCL's own hardware-latency model, ring / Simple protocol, NET 9.6 us vs NVLINK
3.4 us (NVIDIA/nccl ``src/graph/tuning.cc``, ``hwLat``): 936.25 x 9.6 / 3.4 = 2643.5 ns.
Those are the links of the ``*-calibrated`` presets.

The ``a100`` and ``h100`` presets take each link's efficiency and latency from measured
NCCL times instead (:data:`MEASURED_LINKS`): the values with which ASTRA-sim's analytical
network (ring collectives, 4 chunks, as the adapter configures it) comes nearest, in mean
relative error (``stage calibrate data/<gpu>-collectives.csv``), to microsoft/vidur's NCCL kernel
times on DGX A100 and DGX H100 nodes
(``data/<gpu>-collectives.csv``, 64 KiB to 64 MiB): inside a node, all-reduce over 2, 4 and
8 GPUs and send/recv between 2; across nodes, the H100's send/recv between two nodes (one
400 Gb/s port per GPU).  vidur's A100 nodes reach 7.8 GB/s between two GPUs of two nodes
and 17 GB/s of bus bandwidth in a 16-GPU all-reduce, the figures of one 200 Gb/s port shared
by a node, not of a DGX A100's port per GPU; so the a100's InfiniBand keeps its datasheet
25 GB/s per GPU at the efficiency and latency measured on the H100's NDR ports
(``benchmarks/bench_collectives.py`` prints every curve against the model).

Kernel times (the ``shaped`` compute model)
-------------------------------------------
The presets time kernels with the ``shaped`` model (:mod:`.shaped`).  Its GEMM, memory
and per-kernel parameters are fitted by ``stage calibrate`` to CUDA kernel times measured
by microsoft/vidur (``data/a100-kernels.csv``, ``data/h100-kernels.csv``: the QKV, output,
up and down projections of eight Llama-shaped models at 1 to 32,768 tokens and tensor
parallel 1 to 8, the norms, the gated activation, RoPE and the residual add), never to a
step time (:data:`SHAPED_FIT`; ``tests/test_presets.py`` fits the tables again and gets
these numbers).  FlashAttention's efficiencies come from the FlashAttention-2 and -3
papers (vidur's one attention table times a kernel that does not skip a causal mask's
masked half, ``data/README.md``).

The presets as they were before (the ``calibrated`` model, one GEMM efficiency fitted to
a step time) stay available as ``a100-calibrated`` and ``h100-calibrated``.

GEMM efficiency of the ``calibrated`` presets
--------------------------------------------
``gemm_efficiency`` and ``gemm_k_half`` first solve the calibrated model
(:mod:`.compute`) at two published "maximum achievable matmul FLOPS" measurements
(stas00/ml-engineering, ``compute/accelerator/README.md``, BF16 torch.mm, best shape
MxNxK): A100 SXM 267.9 TFLOPS at 6912x16384x2048 (CUDA 12.1) and 271.2 at
1024x10240x5120 (torch 2.6.0+cu126); H100 SXM 792.1 at 6144x17920x2816 (CUDA 12.1) and
794.5 at 2048x2048x13312 (torch 2.7.0+cu126) (:data:`MAMF_GEMM`;
``tests/test_presets.py`` checks that they give these figures back).  That is the best
a GEMM reaches today, after a search over shapes.  The a100 preset then takes
``gemm_efficiency`` from Narayanan et al. 2021, Table 1, 1.7B row (137 TFLOP/s per GPU on
32 A100s, data parallel only, full recompute, micro-batch 4 assumed): the one row whose
step is all compute (no tensor or pipeline parallelism; the data-parallel reduction is
under 0.1% of the simulated step), so one parameter explains it; its other rows are
predicted, not fitted (``benchmarks/bench_table1.py``).  The H100 keeps the MAMF value:
no published H100 run simulates here (Llama 3's Table 4 needs 8,192 ranks).
"""

from __future__ import annotations

from dataclasses import replace

from stage_core.records import GpuSpec, HardwareSpec, LinkSpec

#: the shaped model's parameters fitted to the measured kernel tables (``stage calibrate data/<gpu>-kernels.csv``)
SHAPED_FIT = {
    "a100": {"launch_us": 2.502, "gemm_efficiency": 0.8542, "gemm_k_half": 128.0, "gemm_tile_cost": 0.125,
             "hbm_efficiency": 0.755, "norm_efficiency": 0.3828},
    "h100": {"launch_us": 1.822, "gemm_efficiency": 0.9173, "gemm_k_half": 192.0, "gemm_tile_cost": 0.25,
             "hbm_efficiency": 0.8268, "norm_efficiency": 0.4043},
}
_VIDUR = {"a100": "microsoft/vidur data/profiling/compute/a100/*/mlp.csv @ 7d47513 (8 Llama-shaped models, "
                  "3,864 GEMMs, 2,868 elementwise and 1,902 norm kernels; data/a100-kernels.csv)",
          "h100": "microsoft/vidur data/profiling/compute/h100/*/mlp.csv @ 7d47513 (6 Llama-shaped models, "
                  "2,520 GEMMs, 1,860 elementwise and 1,230 norm kernels; data/h100-kernels.csv)"}


def _shaped_sources(gpu: str) -> dict[str, str]:
    fit = f"fit by stage calibrate to measured kernel times: {_VIDUR[gpu]}"
    return {"launch_us": fit, "gemm_efficiency": fit, "gemm_k_half": fit + " (grid 0-192)",
            "gemm_tile_cost": fit + " (grid 0-2)", "hbm_efficiency": fit + ": the elementwise kernels",
            "norm_efficiency": fit + ": the RMSNorm kernels"}


#: (gemm_efficiency, gemm_k_half) solved at the published maximum achievable matmul rates
MAMF_GEMM = {"a100": (0.895, 86.7), "h100": (0.831, 45.4)}

#: ASTRA-sim's validated HGX H100 NVLink: 400 GiB/s on the 450 GB/s datasheet figure
LINK_EFFICIENCY = 400 * 2**30 / 450e9
NVLINK_LATENCY_NS = 936.25
IB_LATENCY_NS = 2643.5

LINK_SOURCES = {
    "efficiency": "ASTRA-sim examples/network/analytical/HGX-H100-validated.yml: 400 GiB/s achieved on "
                  "NVLink 4's 450 GB/s per direction = 0.9544, assumed for every link",
    "latency_ns": "ASTRA-sim HGX-H100-validated.yml NVLink 936.25 ns; across nodes x 9.6/3.4 "
                  "(NCCL src/graph/tuning.cc hwLat, ring/Simple, NET vs NVLINK) = 2643.5 ns",
}

#: (efficiency, latency ns) per link fitted to the measured NCCL tables (see above)
MEASURED_LINKS = {"a100": {"scale_up": (0.62, 436.0), "scale_out": (0.73, 9852.0)},
                  "h100": {"scale_up": (0.74, 279.0), "scale_out": (0.73, 9852.0)}}
_NCCL = "fit of ASTRA-sim's analytical ring to microsoft/vidur's NCCL times @ 7d47513 (data/{}-collectives.csv): {}"
MEASURED_SOURCES = {
    "a100": {"scale_up": "NVIDIA A100 datasheet: NVLink 600 GB/s total = 300 per direction; efficiency 0.62 and "
                         "latency 436 ns per link: " + _NCCL.format("a100", "all-reduce on 2, 4, 8 GPUs and "
                                                                             "send/recv between 2, in one node"),
             "scale_out": "DGX A100: 8 ConnectX-6 HDR 200 Gb/s compute ports, one per GPU = 25 GB/s; efficiency "
                          "0.73 and latency 9,852 ns per link measured on the H100's NDR ports (vidur's A100 "
                          "nodes share one port: presets.py)"},
    "h100": {"scale_up": "NVIDIA H100 datasheet: NVLink 900 GB/s total = 450 per direction; efficiency 0.74 and "
                         "latency 279 ns per link: " + _NCCL.format("h100", "all-reduce on 2, 4, 8 GPUs and "
                                                                             "send/recv between 2, in one node"),
             "scale_out": "DGX H100: 8 ConnectX-7 NDR 400 Gb/s ports, one per GPU = 50 GB/s; efficiency 0.73 and "
                          "latency 9,852 ns per link: " + _NCCL.format("h100", "send/recv between two nodes")},
}

_FLASH_A100 = ("FlashAttention-2 (Dao 2023, arXiv 2307.08691) on A100: forward up to 73% of the "
               "theoretical peak, 50-73% over the benchmarked shapes")
_LAUNCH = ("assumed: a few microseconds between back-to-back kernels launched from eager PyTorch; "
           "`stage calibrate` fits it from a profile")
_HBM = ("assumed: streaming copies reach about 90% of the HBM datasheet rate; `stage calibrate` fits it "
        "from a profile")

A100_CALIBRATED = GpuSpec(
    name="a100",
    description="NVIDIA A100 SXM4 80GB",
    matmul_tflops={"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
    vector_tflops=19.5,
    hbm_gbps=2039.0,
    sm_count=108,
    compute_model="calibrated",
    memory_gib=80.0,
    parameters={
        "gemm_efficiency": 0.664,
        "gemm_k_half": MAMF_GEMM["a100"][1],
        "flash_fwd_efficiency": 0.70,
        "flash_bwd_efficiency": 0.55,
        "hbm_efficiency": 0.90,
        "launch_us": 3.0,
    },
    sources={
        "matmul_tflops": "NVIDIA A100 datasheet: BF16/FP16 Tensor Core 312 TFLOPS dense (624 with sparsity), "
                         "TF32 156",
        "vector_tflops": "NVIDIA A100 datasheet: FP32 19.5 TFLOPS",
        "hbm_gbps": "NVIDIA A100 datasheet: A100 80GB SXM 2,039 GB/s",
        "sm_count": "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs",
        "memory_gib": "NVIDIA A100 datasheet: A100 80GB (HBM2e)",
        "gemm_efficiency": "fit to Narayanan et al. 2021 Table 1, 1.7B row (137 TFLOP/s, dp32, full recompute, "
                           "micro-batch 4 assumed; presets.py); 0.895 at the published best matmul rates "
                           "(MAMF: 267.9 TFLOPS at 6912x16384x2048, 271.2 at 1024x10240x5120)",
        "gemm_k_half": "solves the model at the two MAMF points with gemm_efficiency 0.895 (presets.py)",
        "flash_fwd_efficiency": _FLASH_A100,
        "flash_bwd_efficiency": _FLASH_A100 + "; the backward pass is slower than the forward",
        "hbm_efficiency": _HBM,
        "launch_us": _LAUNCH,
    },
)

H100_CALIBRATED = GpuSpec(
    name="h100",
    description="NVIDIA H100 SXM5 80GB",
    matmul_tflops={"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 494.7},
    vector_tflops=66.9,
    hbm_gbps=3350.0,
    sm_count=132,
    compute_model="calibrated",
    memory_gib=80.0,
    parameters={
        "gemm_efficiency": MAMF_GEMM["h100"][0],
        "gemm_k_half": MAMF_GEMM["h100"][1],
        "flash_fwd_efficiency": 0.60,
        "flash_bwd_efficiency": 0.45,
        "hbm_efficiency": 0.90,
        "launch_us": 3.0,
    },
    sources={
        "matmul_tflops": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (SXM5): BF16/FP16 989.4 TFLOPS "
                         "dense, FP8 1978.9, TF32 494.7 (the datasheet's 1,979 BF16 is with sparsity)",
        "vector_tflops": "NVIDIA H100 datasheet: FP32 67 TFLOPS (66.9 in the whitepaper)",
        "hbm_gbps": "NVIDIA H100 datasheet: H100 SXM 3.35 TB/s",
        "sm_count": "NVIDIA H100 Tensor Core GPU Architecture whitepaper: 132 SMs on H100 SXM5",
        "memory_gib": "NVIDIA H100 datasheet: H100 SXM 80GB (HBM3)",
        "gemm_efficiency": "solves the model at the two MAMF points (presets.py): 792.1 TFLOPS at "
                           "6144x17920x2816 and 794.5 at 2048x2048x13312",
        "gemm_k_half": "same solve as gemm_efficiency",
        "flash_fwd_efficiency": "FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608): BF16 forward up to "
                                "740 TFLOPS on H100, 75% of peak; FlashAttention-2 on H100 about 35%",
        "flash_bwd_efficiency": "FlashAttention-3 (Shah et al. 2024): backward 1.5-1.75x FlashAttention-2",
        "hbm_efficiency": _HBM,
        "launch_us": _LAUNCH,
    },
)

_FLASH_SOURCES = {
    "a100": {"flash_fwd_efficiency": _FLASH_A100 + "; the shaped model skips a causal mask's masked half",
             "flash_bwd_efficiency": _FLASH_A100 + "; the backward pass is slower than the forward"},
    "h100": {"flash_fwd_efficiency": H100_CALIBRATED.sources["flash_fwd_efficiency"],
             "flash_bwd_efficiency": H100_CALIBRATED.sources["flash_bwd_efficiency"]},
}


def _shaped(gpu: GpuSpec) -> GpuSpec:
    """``gpu`` timed by the shaped model: its fitted parameters, the papers' FlashAttention figures."""
    flash = {k: gpu.parameters[k] for k in ("flash_fwd_efficiency", "flash_bwd_efficiency")}
    sources = {k: v for k, v in gpu.sources.items() if k not in gpu.parameters}
    return replace(gpu, compute_model="shaped", parameters={**SHAPED_FIT[gpu.name], **flash},
                   sources={**sources, **_shaped_sources(gpu.name), **_FLASH_SOURCES[gpu.name]})


A100_GPU = _shaped(A100_CALIBRATED)
H100_GPU = _shaped(H100_CALIBRATED)

_DATASHEET_PRESETS = (
    HardwareSpec(
        name="a100",
        description="nodes of 8 A100 SXM4 80GB on NVLink 3 / NVSwitch, joined by InfiniBand HDR "
                    "(one 200 Gb/s port per GPU, DGX A100)",
        gpu=A100_GPU,
        gpus_per_node=8,
        scale_up=LinkSpec("NVLink 3", 300.0, LINK_EFFICIENCY, NVLINK_LATENCY_NS),
        scale_out=LinkSpec("InfiniBand HDR", 25.0, LINK_EFFICIENCY, IB_LATENCY_NS),
        sources={"scale_up": "NVIDIA A100 datasheet: NVLink 600 GB/s total = 300 per direction; latency "
                             "assumed equal to the H100 NVSwitch hop",
                 "scale_out": "DGX A100: 8 ConnectX-6 HDR 200 Gb/s compute ports, one per GPU = 25 GB/s",
                 **LINK_SOURCES},
    ),
    HardwareSpec(
        name="h100",
        description="nodes of 8 H100 SXM5 80GB on NVLink 4 / NVSwitch, joined by InfiniBand NDR "
                    "(one 400 Gb/s port per GPU, DGX H100)",
        gpu=H100_GPU,
        gpus_per_node=8,
        scale_up=LinkSpec("NVLink 4", 450.0, LINK_EFFICIENCY, NVLINK_LATENCY_NS),
        scale_out=LinkSpec("InfiniBand NDR", 50.0, LINK_EFFICIENCY, IB_LATENCY_NS),
        sources={"scale_up": "NVIDIA H100 datasheet: NVLink 900 GB/s total = 450 per direction",
                 "scale_out": "DGX H100: 8 ConnectX-7 NDR 400 Gb/s ports, one per GPU = 50 GB/s",
                 **LINK_SOURCES},
    ),
)


def _calibrated(hw: HardwareSpec, gpu: GpuSpec) -> HardwareSpec:
    return replace(hw, name=f"{hw.name}-calibrated", gpu=gpu,
                   description=f"{hw.description}; kernels timed by the calibrated model (one GEMM efficiency) and "
                               f"links from datasheets, as the {hw.name} preset was before it was fitted to measured "
                               f"kernels and collectives")


#: the presets as they were, under their own names (the constant-efficiency ``calibrated`` model)
CALIBRATED_PRESETS = (_calibrated(_DATASHEET_PRESETS[0], A100_CALIBRATED),
                      _calibrated(_DATASHEET_PRESETS[1], H100_CALIBRATED))


def _measured(hw: HardwareSpec) -> HardwareSpec:
    """``hw`` with each link's efficiency and latency from the measured NCCL tables."""
    links = {tier: replace(getattr(hw, tier), efficiency=eff, latency_ns=lat)
             for tier, (eff, lat) in MEASURED_LINKS[hw.name].items()}
    sources = {k: v for k, v in hw.sources.items() if k not in LINK_SOURCES}
    return replace(hw, **links, sources={**sources, **MEASURED_SOURCES[hw.name],
                                         "efficiency": "per link, fitted to measured NCCL times (presets.py)",
                                         "latency_ns": "per link, fitted to measured NCCL times (presets.py)"})


#: a100 and h100: kernels by the shaped model, links as measured
PRESETS = tuple(_measured(hw) for hw in _DATASHEET_PRESETS)
