"""Named hardware presets: one GPU's roofline and the two network tiers.

Units are the ones ASTRA-sim reads:

- ``peak_tflops`` goes to system.json "peak-perf", read in TFLOPS
  (astra-sim ``astra-sim/system/Sys.cc``, ``Sys::initialize_sys``: ``peak_perf *
  10^12  // TFLOPS``).  Dense BF16 tensor-core peak (no sparsity), FLOPs not MACs.
- ``hbm_gbps`` goes to system.json "local-mem-bw", read in GB/s (same function,
  ``// GB/sec``).
- ``Link.bandwidth`` goes to the analytical network yml "bandwidth", in the analytical
  backend's GB/s per link and direction, where 1 GB = 2^30 B
  (astra-network-analytical ``BasicTopology::bw_GBps_to_Bpns``).
- ``Link.latency_ns`` goes to the yml "latency", per link in ns; a Switch dimension
  charges two links per message (``Switch::compute_hops_count`` returns 2).

How the network numbers are derived
-----------------------------------
ASTRA-sim ships a configuration calibrated against a real HGX H100 node
(``examples/network/analytical/HGX-H100-validated.yml``: Switch, 8 NPUs,
bandwidth 400.0, latency 936.25 ns).  Its NVLink datasheet figure is 450 GB/s per
direction (900 GB/s total), so ``LINK_SCALE = 400 / 450`` maps a datasheet per-direction
GB/s (10^9 B/s) figure to the backend's number: it absorbs both the 2^30-byte "GB" and
the achievable-vs-peak gap.  We apply the same factor to every link (an assumption for
the links other than H100 NVLink, which have no validated config).

The inter-node per-link latency scales the validated NVLink latency by NCCL's own
hardware-latency model, ring / Simple protocol: NET 9.6 us vs NVLINK 3.4 us
(NVIDIA/nccl ``src/graph/tuning.cc``, ``hwLat``), i.e. 936.25 * 9.6 / 3.4 = 2643.5 ns.
"""

from __future__ import annotations

from dataclasses import dataclass

# backend bandwidth per datasheet GB/s (see module docstring)
LINK_SCALE = 400.0 / 450.0
# validated HGX H100 NVLink per-link latency (ns)
NVLINK_LATENCY_NS = 936.25
# NCCL hwLat ring/Simple NET / NVLINK = 9.6 / 3.4 applied to the NVLink latency
IB_LATENCY_NS = 2643.5


@dataclass(frozen=True)
class Link:
    """One network tier: its name, backend bandwidth (GB/s, 2^30 B) and latency (ns)."""

    name: str
    bandwidth: float
    latency_ns: float
    datasheet_gbps: float  # per direction, 10^9 B/s, before LINK_SCALE


@dataclass(frozen=True)
class HardwarePreset:
    """A node type: GPUs per node, the GPU's roofline, NVLink inside, IB across."""

    name: str
    description: str
    gpus_per_node: int
    peak_tflops: float
    hbm_gbps: float
    scale_up: Link
    scale_out: Link


PRESETS: dict[str, HardwarePreset] = {
    "h100": HardwarePreset(
        name="h100",
        description="nodes of 8 H100 SXM5 80GB on NVLink 4 / NVSwitch, joined by "
        "InfiniBand NDR (one 400 Gb/s port per GPU)",
        gpus_per_node=8,
        # NVIDIA H100 datasheet: BF16 Tensor Core 1,979 TFLOPS *with sparsity*;
        # NVIDIA H100 Tensor Core GPU Architecture whitepaper: 989.4 dense (SXM5).
        peak_tflops=989.4,
        # NVIDIA H100 datasheet: GPU memory bandwidth 3.35 TB/s (SXM).
        hbm_gbps=3350.0,
        # datasheet: NVLink 900 GB/s total = 450 GB/s per direction;
        # 450 * LINK_SCALE = 400.0 (the ASTRA-sim validated value itself).
        scale_up=Link("NVLink 4", 400.0, NVLINK_LATENCY_NS, 450.0),
        # InfiniBand NDR 400 Gb/s = 50 GB/s per direction per GPU (ConnectX-7, one per
        # GPU in DGX H100); 50 * LINK_SCALE = 44.44.
        scale_out=Link("InfiniBand NDR", 44.44, IB_LATENCY_NS, 50.0),
    ),
    "a100": HardwarePreset(
        name="a100",
        description="nodes of 8 A100 SXM4 80GB on NVLink 3 / NVSwitch, joined by "
        "InfiniBand HDR (one 200 Gb/s port per GPU)",
        gpus_per_node=8,
        # NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity).
        peak_tflops=312.0,
        # NVIDIA A100 datasheet: A100 80GB SXM GPU memory bandwidth 2,039 GB/s.
        hbm_gbps=2039.0,
        # datasheet: NVLink 600 GB/s total = 300 GB/s per direction;
        # 300 * LINK_SCALE = 266.67.  Latency: assumed equal to the H100 NVSwitch hop.
        scale_up=Link("NVLink 3", 266.67, NVLINK_LATENCY_NS, 300.0),
        # InfiniBand HDR 200 Gb/s = 25 GB/s per direction per GPU (DGX A100: 8 HDR
        # compute ports); 25 * LINK_SCALE = 22.22.
        scale_out=Link("InfiniBand HDR", 22.22, IB_LATENCY_NS, 25.0),
    ),
}

DEFAULT_PRESET = "h100"


def preset_names() -> list[str]:
    """The valid preset names, sorted."""
    return sorted(PRESETS)
