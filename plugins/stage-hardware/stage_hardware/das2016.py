"""The clusters of Das et al. 2016 (arXiv 1602.06709): dual-socket Xeon E5-2697 v3 nodes on
FDR InfiniBand (``das2016-fdr``) and on 10 Gb Ethernet (``das2016-aws``).

A "GPU" here is one CPU node (one rank per node, as the paper runs one MPI rank per node):

* compute peak, fp32: 2 sockets x 14 cores x 2.6 GHz x 32 single-precision FLOPs per cycle
  (Haswell: two 256-bit FMA units, 2 x 8 lanes x 2 FLOPs) = 2,329.6 GFLOP/s;
* memory: 4 channels of DDR4-2133 per socket, 68 GB/s each (Intel ARK), 136 GB/s a node;
* network: FDR InfiniBand 4x, 56 Gb/s signalling with 64b/66b coding = 54.5 Gb/s of data,
  6.8 GB/s a direction; 10 GbE 1.25 GB/s.

The compute model is ``cpu`` (:mod:`.compute`): a roofline whose compute roof is the peak
times ``matmul_efficiency`` for convolutions and matrix products and ``vector_efficiency``
for the rest.  ``matmul_efficiency`` is the parameter the paper's single-node throughputs
(images/s of VGG-A and OverFeat-FAST on one node) would calibrate; those figures were not
found (:data:`SEARCHED`), so it is assumed, and ``benchmarks/bench_das2016.py`` prints the
single-node throughput and the fraction of peak it gives.
"""

from __future__ import annotations

from stage_core.records import GpuSpec, HardwareSpec, LinkSpec

CORES, GHZ, FLOPS_PER_CYCLE, SOCKETS = 14, 2.6, 32, 2
PEAK_TFLOPS = SOCKETS * CORES * GHZ * FLOPS_PER_CYCLE / 1000  # 2.3296
MEMORY_GBPS = SOCKETS * 68.0

_ARK = "Intel ARK, Xeon E5-2697 v3: 14 cores, 2.60 GHz base, 4 DDR4-2133 channels, max memory bandwidth 68 GB/s"
_HASWELL = ("Intel 64 and IA-32 Architectures Optimization Reference Manual, Haswell: two FMA units of 8 fp32 "
            "lanes, 32 single-precision FLOPs per cycle per core")

#: the compute model's parameters (see the module docstring) and where each comes from
PARAMETERS = {"matmul_efficiency": 0.70, "vector_efficiency": 0.10, "memory_efficiency": 0.80, "launch_us": 20.0}
PARAMETER_SOURCES = {
    "matmul_efficiency": "assumed 0.70 of peak for convolutions and matrix products on MKL: Das et al. 2016's "
                         "single-node throughputs for VGG-A and OverFeat-FAST, which would calibrate it, were not "
                         "found (SEARCHED); with it one node trains VGG-A at 32.8 images/s and OverFeat-FAST at "
                         "94.3 (minibatch 256), 64-68% of peak over the whole step (benchmarks/bench_das2016.py); "
                         "never fitted to the paper's scaling factors",
    "vector_efficiency": "assumed: elementwise and pooling kernels are memory bound on this node; their compute "
                         "roof matters little",
    "memory_efficiency": "assumed: STREAM-like kernels reach about 80% of the DDR4 channels' rate",
    "launch_us": "assumed: an OpenMP parallel region's fork and join across 28 cores, about 20 us",
}

#: where Das et al. 2016's single-node figures were looked for (issue 23, twice), and what was found
SEARCHED = (
    "the paper (arXiv 1602.06709): its abstract only (arxiv listings, paperswithcode, researchtrend.ai, scholarfeed, "
    "a generated summary on paperium.net); no HTML or text of its body in the page, docs, code or issue corpora "
    "(queries: its title, its authors, 'OverFeat-FAST', 'VGG-A', '7-layer DNN', 'E5-2697 v3', 'images/s')",
    "Intel's posts of the same work: 'Caffe Training on Multi-node Distributed-memory Systems Based on Intel Xeon "
    "Processor E5 Family' and 'Myth Busted: General Purpose CPUs Can't Tackle Deep Neural Network Training, Part 2' "
    "(AlexNet on 64 Haswell nodes, the balance equations; no VGG-A or OverFeat-FAST single-node figure)",
    "Sridharan et al. 2018 (arXiv 1801.08030, MLSL): abstract only; its runs are on Skylake and Knights Landing",
    "soumith/convnet-benchmarks (README, the Intel multi-node preview folder, issue 59 'Intel are CPU magicians'): "
    "AlexNet logs on other Xeons, no VGG-A or OverFeat-FAST training throughput on an E5-2697 v3",
)

XEON = GpuSpec(
    name="xeon-e5-2697v3-2s",
    description="a dual-socket Intel Xeon E5-2697 v3 node (2 x 14 Haswell cores, 2.6 GHz, DDR4-2133)",
    matmul_tflops={"fp32": PEAK_TFLOPS, "bf16": PEAK_TFLOPS, "fp16": PEAK_TFLOPS},
    vector_tflops=PEAK_TFLOPS,
    hbm_gbps=MEMORY_GBPS,
    sm_count=SOCKETS * CORES,
    compute_model="cpu",
    memory_gib=128.0,
    parameters=dict(PARAMETERS),
    sources={
        "matmul_tflops": f"2 sockets x 14 cores x 2.6 GHz x 32 FLOPs/cycle = {PEAK_TFLOPS:.4f} TFLOP/s ({_ARK}; "
                         f"{_HASWELL}); bf16/fp16 run as fp32 on this CPU",
        "vector_tflops": "the same FMA units (Haswell has no separate vector peak)",
        "hbm_gbps": f"2 x 68 GB/s ({_ARK})",
        "sm_count": "2 x 14 cores (Intel ARK)",
        "memory_gib": "Das et al. 2016, section 5: 128 GB of DDR4 per node",
        **PARAMETER_SOURCES,
    },
)

FDR = LinkSpec("InfiniBand FDR 4x", 56 * 64 / 66 / 8, 0.90, 1000.0)
ETHERNET = LinkSpec("10 Gb Ethernet", 1.25, 0.90, 25000.0)
_LINKS = {
    "bandwidth": "FDR 4x: 56 Gb/s signalling, 64b/66b coding: 6.79 GB/s a direction; 10GbE: 1.25 GB/s",
    "efficiency": "assumed: large MPI transfers reach about 90% of the link",
    "latency_ns": "assumed: about 1 us a hop on InfiniBand (MPI over verbs), 25 us over TCP on Ethernet",
}

PRESETS = (
    HardwareSpec("das2016-fdr", "Das et al. 2016's cluster: dual-socket Xeon E5-2697 v3 nodes on FDR InfiniBand, "
                 "one rank per node", XEON, 1, FDR, FDR,
                 sources={"scale_out": "Das et al. 2016, section 5: FDR InfiniBand", **_LINKS}),
    HardwareSpec("das2016-aws", "Das et al. 2016's Ethernet cluster: the same nodes on 10 Gb Ethernet, one rank "
                 "per node", XEON, 1, ETHERNET, ETHERNET,
                 sources={"scale_out": "Das et al. 2016, section 6.4: AWS EC2 instances on 10 Gb Ethernet",
                          **_LINKS}),
)
