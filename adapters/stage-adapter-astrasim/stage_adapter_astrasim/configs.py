"""Build the three ASTRA-sim configs for a world size, from a preset or the user's files.

Shapes follow the ASTRA-sim run in the STAGE samples (astra-sim's
``examples/system/native_collectives/HGX-H100-validated.json``, ``examples/network/
analytical/HGX-H100-validated.yml``, ``examples/remote_memory/analytical/
no_memory_expansion.json``).

Presets are the hardware records plugins register (``stage_hardware``, read through
the plugin host); this module only turns one into ASTRA-sim's units: ``peak-perf`` in
TFLOPS and ``local-mem-bw`` in GB/s (astra-sim ``Sys::initialize_sys``), network
bandwidth in the analytical backend's GB/s of 2^30 bytes per link and direction
(astra-network-analytical ``BasicTopology::bw_GBps_to_Bpns``), latency per link in ns
(a Switch charges two links per message).  The network's shape, its bandwidths and the
system settings the timings depend on come from :mod:`stage_core.netmodel`, which
``stage estimate`` times messages with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from math import prod
from pathlib import Path

from stage_core.api import UsageError, hardware, netmodel
from stage_core.records import HardwareSpec

from . import netyml

SYSTEM_FILE = "system.json"
NETWORK_FILE = "network.yml"
MEMORY_FILE = "memory.json"

MEMORY = {"memory-type": "NO_MEMORY_EXPANSION"}
DEFAULT_PRESET = "h100"


@dataclass(frozen=True)
class Configs:
    """The text of each config file and where each came from (for the report)."""

    system_text: str
    network_text: str
    memory_text: str
    system_source: str  # "preset h100" or "file /abs/path"
    network_source: str
    preset: HardwareSpec | None = None  # the hardware, unless the system is a user's system.json


backend_bandwidth = netmodel.backend_bandwidth


def system_config(preset: HardwareSpec, dims: int, *, timed: bool = False, trace: bool = False) -> dict:
    """system.json for ``preset`` on a network of ``dims`` dimensions.

    ``timed``: the traces carry each compute node's ``duration_micros``, so the
    roofline is switched off and the simulator replays the durations
    (astra-sim ``Workload::issue``); ``num_ops`` and ``tensor_size`` stay in the
    traces for tools that read them.  ``trace``: the simulator logs every node's issue
    and completion (``"trace-enabled"``, read by :mod:`.timeline`).
    """
    per_dim = ["ring"] * dims  # one collective implementation per network dimension
    config = {
        "scheduling-policy": "LIFO",
        "endpoint-delay": netmodel.ENDPOINT_DELAY_NS,
        "active-chunks-per-dimension": 1,
        "preferred-dataset-splits": netmodel.DATASET_SPLITS,
        "all-reduce-implementation": per_dim,
        "all-gather-implementation": list(per_dim),
        "reduce-scatter-implementation": list(per_dim),
        "all-to-all-implementation": list(per_dim),
        "collective-optimization": "localBWAware",
        "local-mem-bw": preset.gpu.hbm_gbps,  # GB/s
        "boost-mode": 0,
        "roofline-enabled": 0 if timed else 1,
        "peak-perf": preset.gpu.peak_flops("bf16") / 1e12,  # TFLOPS, dense BF16
    }
    if trace:
        config["trace-enabled"] = 1
    return config


def network_dims(preset: HardwareSpec, world: int) -> netyml.NetworkDims:
    """Switch (NVLink) inside a node; a second Switch (IB) across nodes when world > node."""
    node = preset.gpus_per_node
    if world < 2:
        raise UsageError(f"world size {world} is too small: ASTRA-sim's analytical "
                         "network needs at least 2 NPUs")
    if world > node and world % node:
        raise UsageError(f"world size {world} does not fit preset {preset.name}: more "
                         f"than one node needs a multiple of {node} GPUs per node")
    dims = netmodel.dimensions(preset, world)
    return netyml.NetworkDims(tuple("Switch" for _ in dims), tuple(n for n, _ in dims),
                              tuple(backend_bandwidth(link) for _, link in dims),
                              tuple(link.latency_ns for _, link in dims))


def _looks_like_path(value: str) -> bool:
    return "/" in value or "\\" in value or "." in value


def resolve_preset(value: str, presets: dict[str, HardwareSpec]) -> HardwareSpec | None:
    """The preset named ``value``, a hardware file's record, or None when ``value``
    names a system.json of ASTRA-sim's own."""
    key = value.strip().lower()
    if key in presets:
        return presets[key]
    path = Path(value).expanduser()
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # reported when the file is read as a system.json
        if isinstance(data, dict) and "gpu" in data and "scale_up" in data:
            return hardware.from_dict(data, f"--system {value}")
        return None
    valid = ", ".join(sorted(presets)) or "none (install stage-hardware)"
    if _looks_like_path(value):
        raise UsageError(f"--system file {value} not found (or give a preset: {valid})")
    raise UsageError(f"unknown --system preset {value!r}: valid presets are {valid}, "
                     "or a system.json or hardware file")


def _read_user_file(value: str, flag: str) -> tuple[Path, str]:
    path = Path(value).expanduser()
    if not path.is_file():
        raise UsageError(f"{flag} file {value} not found")
    return path.resolve(), path.read_text()


def _check_user_system(path: Path, text: str) -> None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--system file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--system file {path} must hold a JSON object")


def _check_user_network(path: Path, text: str, world: int) -> None:
    npus = netyml.read_flow_lists(text).get("npus_count")
    if npus and all(isinstance(n, int) for n in npus) and prod(npus) != world:
        raise UsageError(f"--network file {path}: npus_count {npus} makes {prod(npus)} "
                         f"NPUs but the trace set has world_size {world}")


def build_configs(world: int, system: str | None = None, network: str | None = None, *,
                  presets: dict[str, HardwareSpec], timed: bool = False, trace: bool = False) -> Configs:
    """The configs for a world of ``world`` ranks.

    ``system`` is a preset name (of ``presets``), a hardware file or a system.json
    path (default: the h100 preset); ``network`` a network yml path.  Without
    ``network`` the network comes from the system preset, or from the default preset
    when ``system`` is a system.json.  ``timed``: the traces carry durations;
    ``trace``: log every node (see :func:`system_config`; a user's system.json gets
    ``"trace-enabled": 1`` added).
    """
    system = system or DEFAULT_PRESET
    preset = resolve_preset(system, presets)
    net_preset = preset
    if net_preset is None and network is None:
        net_preset = resolve_preset(DEFAULT_PRESET, presets)

    if network is not None:
        net_path, network_text = _read_user_file(network, "--network")
        _check_user_network(net_path, network_text, world)
        network_source = f"file {net_path}"
        dims_count = len(netyml.read_flow_lists(network_text).get("topology", [])) or 1
    else:
        dims = network_dims(net_preset, world)
        header = (f"ASTRA-sim analytical network written by stage-adapter-astrasim\n"
                  f"preset {net_preset.name}: {net_preset.description}\n"
                  f"world size {world}")
        network_text = netyml.render(dims, header)
        network_source = f"preset {net_preset.name}"
        dims_count = len(dims.topology)

    if preset is None:
        sys_path, system_text = _read_user_file(system, "--system")
        _check_user_system(sys_path, system_text)
        if trace:
            system_text = json.dumps({**json.loads(system_text), "trace-enabled": 1}, indent=4) + "\n"
        system_source = f"file {sys_path}"
    else:
        system_text = json.dumps(system_config(preset, dims_count, timed=timed, trace=trace), indent=4) + "\n"
        system_source = f"preset {preset.name}"

    return Configs(system_text, network_text, json.dumps(MEMORY) + "\n",
                   system_source, network_source, preset)
