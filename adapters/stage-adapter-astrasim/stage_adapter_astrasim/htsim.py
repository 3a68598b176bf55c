"""htsim's fat tree from a hardware preset, and htsim's limits as checks and explanations.

The ``.topo`` format is csg-htsim's (``sim/datacenter/fat_tree_topology.cpp``,
``FatTreeTopology::load``, at the commit ASTRA-sim pins, 67cbbbb): a header (``Nodes``,
``Tiers``, ``Podsize``) and per tier ``Downlink_speed_Gbps`` and ``Downlink_Latency_ns``
(whole numbers: read with ``stoi``), ``Radix_Down``, ``Radix_Up`` (below the top tier),
``Oversubscribed`` and ``Bundle``.  What the loader insists on (each checked by an
assertion or an ``exit(1)`` there, so a file that breaks one never runs):

* every host on one pod in two tiers; ``Podsize`` a multiple of tier 0's
  ``Radix_Down``; ``Radix_Down / Radix_Up`` of tier 0 equal to ``Oversubscribed``;
* ``Nodes x speed(tier 0) / (speed(tier 1) x Oversubscribed)`` a whole number of
  uplinks, a multiple of tier 1's ``Radix_Down``, giving the aggregation switches
  (times tier 1's ``Bundle``: tier 0's ``Radix_Up``);
* a ToR switch has at most 96 ports, an aggregation switch at most 64.

What the frontend adds (astra-sim ``network_frontend/htsim``, read in the code, the
behaviour seen with the binary in the team's shared folder): ``-topo`` must give exactly
one host per rank; the switch queues are 8 packets of 1,500 bytes, set by the frontend
(a ``Queue_Up``/``Queue_Down`` line in the file is refused as a duplicate); path
choice among equal paths is ``rand()`` seeded with ``time(NULL)`` (no seed option); a
message's size is a C ``int`` and TCP sends one extra 1,500-byte packet per flow, which
the frontend also counts as received (a later receive of the same tag, source and
destination can complete early on those bytes: ``benchmarks/bench_backends.py``);
simulated time ends at 4 s, and a message that starts after about 3 s aborts the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from stage_core.api import UsageError
from stage_core.records import HardwareSpec, LinkSpec

TOPOLOGY_FILE = "topology.topo"
MAX_TOR_PORTS = 96  # assert(switches_lp[tor]->addPort(...) < 96)
MAX_AGG_PORTS = 64  # assert(switches_up[agg]->addPort(...) < 64)
#: htsim's TCP packet (Packet::data_packet_size, DEFAULTDATASIZE)
PACKET_BYTES = 1500
#: switch queues the frontend gives every port (memFromPkt(8))
QUEUE_PACKETS = 8
#: the largest message the frontend carries: a C int holds size + one packet (TcpSrc::set_flowsize)
MAX_MESSAGE_BYTES = 2**31 - 1 - PACKET_BYTES

#: what htsim's fat tree cannot say about a node of GPUs, in one line
CANNOT_EXPRESS = ("htsim cannot express a GPU's two ports (its scale-up link and its NIC are one link to its "
                  "node's switch), a chosen path (uplinks are picked at random, seeded from the clock) or "
                  f"switch buffers (8 packets of {PACKET_BYTES:,} bytes, fixed by ASTRA-sim's frontend)")


def gbps(link: LinkSpec) -> float:
    """``link``'s achieved bandwidth in Gb/s (10^9 bits per second)."""
    return link.bytes_per_second * 8 / 1e9


@dataclass(frozen=True)
class FatTree:
    """A two-tier htsim fat tree: hosts on ToR switches, ToRs joined by aggregation switches."""

    nodes: int
    tor_hosts: int  # tier 0 Radix_Down
    tor_uplinks: int  # tier 0 Radix_Up
    host_gbps: int
    host_latency_ns: int
    up_gbps: int
    up_latency_ns: int
    agg_down: int  # tier 1 Radix_Down (the loader's count of uplinks per aggregation switch)
    notes: tuple[str, ...] = ()

    @property
    def oversubscribed(self) -> int:
        return self.tor_hosts // self.tor_uplinks

    def render(self, header: str = "") -> str:
        lines = [f"# {h}" for h in header.splitlines() if h]
        lines += [f"# {n}" for n in self.notes]
        lines += [f"Nodes {self.nodes}", "Tiers 2", f"Podsize {self.nodes}", "",
                  "Tier 0", f"Downlink_speed_Gbps {self.host_gbps}", f"Radix_Down {self.tor_hosts}",
                  f"Radix_Up {self.tor_uplinks}"]
        if self.oversubscribed != 1:
            lines.append(f"Oversubscribed {self.oversubscribed}")
        lines += [f"Downlink_Latency_ns {self.host_latency_ns}", "",
                  "Tier 1", f"Downlink_speed_Gbps {self.up_gbps}", f"Radix_Down {self.agg_down}",
                  f"Downlink_Latency_ns {self.up_latency_ns}"]
        return "\n".join(lines) + "\n"


def _whole(value: float, what: str) -> int:
    out = round(value)
    if out < 1:
        raise UsageError(f"htsim takes whole Gb/s and ns: {what} {value:g} rounds to 0")
    return out


def fat_tree(hw: HardwareSpec, world: int) -> FatTree:
    """htsim's fat tree for ``world`` ranks of ``hw``.

    One node: a single switch of ``world`` hosts on the scale-up link (every pair one
    path, so runs repeat exactly).  More: a ToR switch per node (the scale-up domain)
    with one uplink per GPU at the scale-out link's speed, to ``gpus_per_node``
    aggregation switches (one per rail); between nodes htsim picks an aggregation
    switch at random.  Speeds are whole Gb/s: the scale-out link's rounded, the
    scale-up link's rounded to the nearest multiple the loader accepts (the number of
    uplinks it computes must be whole), said in :attr:`FatTree.notes`.
    """
    node = hw.gpus_per_node
    up_lat = _whole(hw.scale_up.latency_ns, f"{hw.name} scale-up latency (ns)")
    host = _whole(gbps(hw.scale_up), f"{hw.name} scale-up bandwidth (Gb/s)")
    if world <= node:
        if world + 1 > MAX_TOR_PORTS:
            raise UsageError(f"htsim cannot build one switch of {world} hosts: its switches have at most "
                             f"{MAX_TOR_PORTS} ports (fat_tree_topology.cpp)")
        # one uplink, unused: the format wants two tiers
        return FatTree(world, world, 1, host, up_lat, host, up_lat, 1)
    nodes = world // node
    if 2 * node > MAX_TOR_PORTS:
        raise UsageError(f"htsim cannot build preset {hw.name}'s nodes: a node switch of {node} GPUs and "
                         f"{node} uplinks needs {2 * node} ports, htsim's have at most {MAX_TOR_PORTS}")
    if nodes > MAX_AGG_PORTS:
        raise UsageError(f"htsim cannot build preset {hw.name}'s network for {world} ranks: {nodes} nodes need "
                         f"aggregation switches of {nodes} ports, htsim's have at most {MAX_AGG_PORTS} "
                         f"(fat_tree_topology.cpp); the most it builds is {MAX_AGG_PORTS * node} ranks")
    out = _whole(gbps(hw.scale_out), f"{hw.name} scale-out bandwidth (Gb/s)")
    step = out // math.gcd(nodes, out)  # the host speed must make nodes x host / out whole
    wanted = gbps(hw.scale_up)
    host = max(step, step * round(wanted / step))
    notes = [f"scale-up {wanted:,.1f} Gb/s written as {host:,} (whole Gb/s; {nodes} x it must divide by the "
             f"scale-out's {out:,})"]
    notes.append("between nodes a message crosses 4 links (to its node's switch, up, down, to the GPU); the "
                 "analytical network charges the scale-out link twice")
    return FatTree(world, node, node, host, up_lat, out, _whole(hw.scale_out.latency_ns,
                                                              f"{hw.name} scale-out latency (ns)"),
                   nodes * host // out, tuple(notes))


def read_topology(path: str, world: int) -> str:
    """A user's ``.topo``: its text, refused when it cannot carry ``world`` ranks."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UsageError(f"--topology file {path} not found")
    text = file.read_text()
    values: dict[tuple[int, str], int] = {}
    tier = -1
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        key = words[0].lower()
        if key == "tier":
            tier = int(words[1]) if len(words) > 1 and words[1].isdigit() else -2
            continue
        if len(words) > 1:
            try:
                values[(tier, key)] = int(words[1])
            except ValueError:
                raise UsageError(f"--topology {path} line {number}: {words[1]!r} is not a whole number "
                                 "(htsim reads whole Gb/s, ns and counts)") from None
    nodes = values.get((-1, "nodes"))
    if nodes != world:
        raise UsageError(f"--topology {path}: Nodes {nodes} but the trace set has world size {world}: htsim "
                         "needs one host per rank")
    down, up = values.get((0, "radix_down"), 0), values.get((0, "radix_up"), 0)
    if down + up > MAX_TOR_PORTS:
        raise UsageError(f"--topology {path}: tier 0 switches of {down} + {up} ports; htsim's have at most "
                         f"{MAX_TOR_PORTS}")
    return text


#: known ways htsim's frontend aborts, and what they mean
ABORTS = {
    "notify_sender_sending_finished failed": (
        "htsim's TCP acknowledged one flow's end twice, which ASTRA-sim's frontend does not allow; seen where "
        f"packets are lost, as between nodes (switch ports buffer {QUEUE_PACKETS} packets, fixed by the frontend), "
        f"and for a message of exactly {PACKET_BYTES:,} bytes"),
    "when>=now()": (
        "htsim's TCP retransmission timer scheduled an event in the past; seen after packet loss between nodes, "
        "and for every message that starts after 3 s of simulated time (TCP's first retransmission timeout is "
        "3 s, tcp.cpp)"),
}


def explain(stderr_tail: str) -> str | None:
    """What a known htsim assertion in ``stderr_tail`` means, or None."""
    for key, meaning in ABORTS.items():
        if key in stderr_tail:
            return meaning
    return None
