"""Hardware records as files, lookup by name or file, and the time of a transfer.

A hardware preset (:class:`~stage_core.records.HardwareSpec`) comes from a plugin
(``stage_hardware``) or from a JSON file of the same fields (what ``stage calibrate``
writes and ``--gpu FILE`` reads)::

    {"name": "a100-mine", "description": "...", "gpus_per_node": 8,
     "gpu": {"name": "a100", "description": "...", "matmul_tflops": {"bf16": 312.0},
             "vector_tflops": 19.5, "hbm_gbps": 2039.0, "sm_count": 108,
             "compute_model": "calibrated", "parameters": {...}, "sources": {...}},
     "scale_up": {"name": "NVLink 3", "bandwidth_gbps": 300.0, "efficiency": 0.954,
                  "latency_ns": 936.25},
     "scale_out": {...}, "sources": {...}}

:func:`transfer_seconds` is the textbook ring estimate of a collective or a send on
the tier a group spans (inside one node: NVLink; across nodes: the network), for
decisions made before any simulator runs (where lowering may put background
communication) and for estimators.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import UsageError
from .inputs import read_json
from .output import STAGE_MARK, stage_mark, write_output
from .records import GpuSpec, HardwareSpec, LinkSpec

_GPU_FIELDS = {f.name for f in dataclasses.fields(GpuSpec)}
_LINK_FIELDS = {f.name for f in dataclasses.fields(LinkSpec)}
_HW_FIELDS = {f.name for f in dataclasses.fields(HardwareSpec)} - {"plugin"}


def to_dict(hw: HardwareSpec) -> dict[str, Any]:
    """A JSON-ready dict of ``hw`` (the file format; ``plugin`` left out)."""
    out = dataclasses.asdict(hw)
    out.pop("plugin", None)
    out["gpu"]["matmul_tflops"] = dict(hw.gpu.matmul_tflops)
    out["gpu"]["parameters"] = dict(hw.gpu.parameters)
    out["gpu"]["sources"] = dict(hw.gpu.sources)
    out["sources"] = dict(hw.sources)
    return out


def _record(cls, data: Any, fields: set[str], where: str):
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object")
    unknown = sorted(set(data) - fields)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(fields))}")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in data]
    if missing:
        raise UsageError(f"{where}: missing key {missing[0]!r}")
    return data


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise UsageError(f"{where}: {value!r} is not a positive finite number")
    return value


def parameter_problem(name: str, value: Any) -> str | None:
    """What is wrong with a compute model's parameter, or None: it must be a finite
    number, 0 or more; one named ``*_efficiency`` is a share of a datasheet figure, above
    0 and at most 1 (no kernel runs faster than the GPU's peak or its memory's bandwidth)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        return "is not a finite number of 0 or more"
    if name.endswith("_efficiency") and not 0 < value <= 1:
        return "is not a share of the datasheet's figure (above 0, at most 1)"
    return None


def from_dict(data: Any, where: str = "hardware file") -> HardwareSpec:
    """A :class:`HardwareSpec` from the file format; bad content is a one-line UsageError."""
    if isinstance(data, dict) and STAGE_MARK in data:  # (the mark of a file STAGE wrote)
        data = {k: v for k, v in data.items() if k != STAGE_MARK}
    data = _record(HardwareSpec, data, _HW_FIELDS, where)
    gpu = dict(_record(GpuSpec, data["gpu"], _GPU_FIELDS, f"{where}: gpu"))
    tflops = gpu["matmul_tflops"]
    if not isinstance(tflops, dict) or not tflops:
        raise UsageError(f"{where}: gpu.matmul_tflops must map a dtype to TFLOPS, e.g. {{\"bf16\": 312.0}}")
    for key, value in tflops.items():
        _positive(value, f"{where}: gpu.matmul_tflops.{key}")
    for key in ("vector_tflops", "hbm_gbps", "sm_count"):
        _positive(gpu[key], f"{where}: gpu.{key}")
    if not isinstance(gpu["sm_count"], int):
        raise UsageError(f"{where}: gpu.sm_count {gpu['sm_count']!r} is not a whole number")
    for key in ("parameters", "sources"):
        if not isinstance(gpu.get(key, {}), dict):
            raise UsageError(f"{where}: gpu.{key} must be an object")
    for key, value in gpu.get("parameters", {}).items():
        problem = parameter_problem(str(key), value)
        if problem:
            raise UsageError(f"{where}: gpu.parameters.{key} {value!r} {problem}")
    if "memory_gib" in gpu:
        memory = gpu["memory_gib"]
        if isinstance(memory, bool) or not isinstance(memory, (int, float)) or not 0 <= memory < math.inf:
            raise UsageError(f"{where}: gpu.memory_gib {memory!r} is not a finite number of 0 or more")
    if not isinstance(data.get("sources", {}), dict):
        raise UsageError(f"{where}: sources must be an object")
    links = {}
    for tier in ("scale_up", "scale_out"):
        link = _record(LinkSpec, data[tier], _LINK_FIELDS, f"{where}: {tier}")
        for key in ("bandwidth_gbps", "efficiency", "latency_ns"):
            _positive(link[key], f"{where}: {tier}.{key}")
        if link["efficiency"] > 1:
            raise UsageError(f"{where}: {tier}.efficiency {link['efficiency']!r} is above 1 (a share of the "
                             f"link's bandwidth)")
        links[tier] = LinkSpec(**link)
    if not isinstance(data["gpus_per_node"], int) or data["gpus_per_node"] < 1:
        raise UsageError(f"{where}: gpus_per_node {data['gpus_per_node']!r} is not a positive whole number")
    return HardwareSpec(name=str(data["name"]), description=str(data["description"]), gpu=GpuSpec(**gpu),
                        gpus_per_node=data["gpus_per_node"], sources=dict(data.get("sources", {})), **links)


def load(path: Path, flag: str = "--gpu") -> HardwareSpec:
    """Read a hardware file."""
    return from_dict(read_json(path, f"{flag} {path}"), f"{flag} {path}")


def save(hw: HardwareSpec, path: Path, flag: str = "-o", **rule) -> Path:
    """Write ``hw`` as a hardware file by STAGE's output rule (:func:`stage_core.output.write_output`;
    ``rule``: its ``inputs``, ``force``, ``within_set``), marked as STAGE's."""
    return write_output(path, json.dumps({**stage_mark(), **to_dict(hw)}, indent=2) + "\n", flag, **rule)


#: ``--gpu none``: no compute model; the simulator's roofline times the kernels
UNTIMED = "none"
#: what an untimed manifest says times its kernels (its ``kernel_times``)
ROOFLINE_NOTE = ("none: ASTRA-sim's roofline times each kernel (max of num_ops / peak-perf and tensor_size / "
                 "local-mem-bw of the system it runs on)")


def kernel_times(manifest: dict) -> str:
    """What times a set's kernels, as its manifest says: "<compute model> on <hardware>", or the roofline note."""
    hw = manifest.get("hardware")
    if manifest.get("compute_model") and isinstance(hw, dict):
        return f"{manifest['compute_model']} on {hw.get('name')}"
    return manifest.get("kernel_times") or ROOFLINE_NOTE


def resolve_or_none(host, value: str | None, default: str | None = None, flag: str = "--gpu") -> HardwareSpec | None:
    """:func:`resolve` of ``value`` (or ``default`` when it is None); None for ``none``, and for a
    default preset no plugin registers (the core alone)."""
    if value is None:
        if default is None or default not in {h.name for h in host.hardware()}:
            return None
        value = default
    if value.strip().lower() == UNTIMED:
        return None
    return resolve(host, value, flag)


def resolve(host, value: str, flag: str = "--gpu") -> HardwareSpec:
    """A preset registered by a plugin, by name, or a hardware file."""
    names = {h.name for h in host.hardware()}
    if value in names:
        return host.hardware_preset(value, flag)
    if value.endswith(".json") or Path(value).is_file():
        return load(Path(value), flag)
    return host.hardware_preset(value, flag)  # raises, listing the presets


# --------------------------------------------------------------------------- transfers


def tier(hw: HardwareSpec, ranks: Sequence[int]) -> LinkSpec:
    """The link a group's traffic is bound by: NVLink when it sits in one node."""
    nodes = {r // hw.gpus_per_node for r in ranks}
    return hw.scale_up if len(nodes) <= 1 else hw.scale_out


#: links a message crosses between two GPUs of a switched tier
LINKS_PER_HOP = 2
#: bytes each rank moves per byte of ``comm_size``, ring algorithms on n ranks
RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,  # comm_size: the full input
    "all_gather": lambda n: n - 1,  # comm_size: the per-rank shard
    "all_to_all": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
}
#: sequential steps of the ring algorithm on n ranks; each crosses two links (GPU to
#: switch to GPU: NVSwitch inside a node, the network's switch across nodes)
RING_STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "reduce_scatter": lambda n: n - 1,
    "all_gather": lambda n: n - 1,
    "all_to_all": lambda n: n - 1,
    "send": lambda n: 1,
}


def wire_bytes(kind: str, comm_size: int, n: int) -> int:
    """Bytes one rank sends on its link for a collective of ``comm_size`` bytes (ASTRA-sim's
    meaning of comm_size, REFERENCE §6) on a group of ``n`` ranks, by the ring algorithm
    (:data:`RING_FACTOR`): all-reduce 2(n-1)/n of the buffer, reduce-scatter and
    all-to-all (n-1)/n of it, all-gather n-1 shards; a send or receive its size; a group
    of one rank moves nothing.  Whole bytes (rounded down)."""
    if kind in ("send", "recv"):
        return comm_size
    if n <= 1:
        return 0
    if kind == "all_gather":
        return (n - 1) * comm_size
    return (2 if kind == "all_reduce" else 1) * (n - 1) * comm_size // n


def transfer_seconds(hw: HardwareSpec, kind: str, comm_size: int, ranks: Sequence[int]) -> float:
    """Seconds a ring collective (or a send) of ``comm_size`` bytes takes on ``ranks``."""
    n = max(len(ranks), 2) if kind != "send" else 2
    link = tier(hw, ranks)
    return (RING_FACTOR[kind](n) * comm_size / link.bytes_per_second
            + RING_STEPS[kind](n) * LINKS_PER_HOP * link.latency_ns * 1e-9)


def transfer_bytes(hw: HardwareSpec, kind: str, seconds: float, ranks: Sequence[int]) -> int:
    """The ``comm_size`` that :func:`transfer_seconds` says takes ``seconds`` (0 if none fits)."""
    n = max(len(ranks), 2) if kind != "send" else 2
    link = tier(hw, ranks)
    left = seconds - RING_STEPS[kind](n) * LINKS_PER_HOP * link.latency_ns * 1e-9
    return max(0, int(left * link.bytes_per_second / RING_FACTOR[kind](n)))



# --------------------------------------------------------------------------- the simulator's first tick


def first_kernel(nodes: Sequence[Any]) -> Any | None:
    """The compute node a rank issues at time 0: the lowest-id compute node with no
    dependency (ASTRA-sim issues ready nodes in ascending id, one compute at a time).

    ``nodes`` are program nodes or decoded trace nodes (both have ``id``, ``type``,
    ``data_deps`` and ``ctrl_deps``).
    """
    from .trace import NodeType

    roots = [n for n in nodes if n.type == NodeType.COMP and not n.data_deps and not n.ctrl_deps]
    return min(roots, key=lambda n: n.id, default=None)


def roofline_ns(num_ops: int, tensor_size: int, peak_tflops: float, mem_gbps: float) -> int:
    """ASTRA-sim's roofline time of a compute node, in its whole nanoseconds.

    ``Workload::issue_comp``: num_ops over min(peak, bandwidth x num_ops/tensor_size),
    truncated to an integer number of ns (``peak-perf`` in TFLOPS, ``local-mem-bw``
    in GB/s, as system.json gives them).
    """
    seconds = max(num_ops / (peak_tflops * 1e12), tensor_size / (mem_gbps * 1e9))
    return int(seconds * 1e9)


#: why a kernel of 0 ns at time 0 matters (astra-network-analytical EventQueue::proceed)
TICK_ZERO = ("ASTRA-sim aborts when a node finishes in 0 ns at time 0 (an EventQueue assertion, "
             "exit status -6)")
