"""ASTRA-sim's network backends: what each is called, where its binary is found, what it takes.

All three read the same trace set, system.json, memory.json and network.yml (whose
``npus_count`` tells the system layer how to split collectives into per-dimension
phases); they differ in how a message crosses the network:

* ``analytical``: congestion-unaware, a message takes ``2 x latency + bytes /
  bandwidth`` (``stage_core.netmodel`` reproduces it to the nanosecond);
* ``analytical-aware``: congestion-aware, links are shared; this build takes a network
  of one dimension only (``only support 1-dim topology``), so one node at most;
* ``htsim``: packet level, Broadcom's csg-htsim (TCP over a fat tree of switches);
  the fat tree comes from a ``.topo`` file (:mod:`.htsim`), network.yml's bandwidth and
  latency are not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Backend:
    """One network backend of ASTRA-sim."""

    name: str
    #: the environment variable that names its binary
    env_var: str
    #: names looked up on PATH when neither --astra-sim nor the variable is set
    path_names: tuple[str, ...]
    #: where astra-sim's build scripts put the binary
    build_path: str
    #: the stage_simulators name it registers under
    simulator: str
    description: str
    #: simulated time after which the backend cannot run a step, ns (None: no limit)
    time_limit_ns: int | None = None
    #: simulated time at which the backend ends every run, ns
    stops_at_ns: int | None = None
    #: networks of one dimension only
    one_dimension: bool = False


ANALYTICAL = Backend(
    name="analytical", env_var="ASTRA_SIM_BIN",
    path_names=("AstraSim_Analytical_Congestion_Unaware",),
    build_path="build/astra_analytical/build/bin/AstraSim_Analytical_Congestion_Unaware",
    simulator="astrasim",
    description="ASTRA-sim's analytical backend (congestion-unaware): $ASTRA_SIM_BIN or on PATH")
ANALYTICAL_AWARE = Backend(
    name="analytical-aware", env_var="ASTRA_SIM_AWARE_BIN",
    path_names=("AstraSim_Analytical_Congestion_Aware",),
    build_path="build/astra_analytical/build/bin/AstraSim_Analytical_Congestion_Aware",
    simulator="astrasim-aware", one_dimension=True,
    description="ASTRA-sim's analytical backend, congestion-aware (one node at most): $ASTRA_SIM_AWARE_BIN or "
                "on PATH")
HTSIM = Backend(
    name="htsim", env_var="ASTRA_SIM_HTSIM_BIN", path_names=("AstraSim_HTSim",),
    build_path="build/astra_htsim/build/bin/AstraSim_HTSim",
    # HTSimProtoTcp ends every run at 4 s (eventlist.setEndtime(timeFromSec(4))); a message that starts after
    # about 3 s aborts it (EventList::sourceIsPending: when>=now(); bisected with this adapter: a 64 KiB
    # all-reduce after a kernel of 2.99996 s finishes, after 3.00004 s aborts; TCP's first retransmission
    # timeout is 3 s, tcp.cpp _rto = timeFromMs(3000))
    simulator="astrasim-htsim", time_limit_ns=3 * 10**9, stops_at_ns=4 * 10**9,
    description="ASTRA-sim's packet-level htsim backend (TCP over a fat tree written from the hardware preset; "
                "no message may start after 3 s of simulated time, every run ends at 4 s): $ASTRA_SIM_HTSIM_BIN "
                "or on PATH")

BACKENDS = {b.name: b for b in (ANALYTICAL, ANALYTICAL_AWARE, HTSIM)}
DEFAULT = ANALYTICAL


def named(name: str | None, binary: str | None = None) -> Backend:
    """The backend called ``name``; without a name, the one ``binary``'s file name says
    (``…HTSim``/``htsim``, ``…Congestion_Aware``/``analytical-aware``), else analytical."""
    if name is None:
        base = Path(binary).name.lower() if binary else ""
        if "htsim" in base:
            return HTSIM
        if "aware" in base and "unaware" not in base:
            return ANALYTICAL_AWARE
        return DEFAULT
    return BACKENDS[name]
