"""ASTRA-sim's analytical network as the simulator computes it, and a step's breakdown.

One place for what both the ASTRA-sim adapter and ``stage estimate`` (stage-search) need:
the adapter writes the network this module describes (:func:`dimensions`,
:func:`backend_bandwidth`) and reads its per-node log into compute, exposed
communication and bubble (:func:`step_breakdown`); the estimator times every send and
collective with :class:`Network` and breaks its replay down the same way.

What the simulator is given (the ASTRA-sim adapter's configs): a ``Switch`` dimension
of ``gpus_per_node`` NPUs on the scale-up link, and, above one node, a second
``Switch`` of the nodes on the scale-out link; per dimension the link's achieved
bandwidth in GiB/s rounded to two decimals (:func:`backend_bandwidth`) and its
latency per link; ``system.json`` with ring collectives on every dimension,
``preferred-dataset-splits`` 4, ``active-chunks-per-dimension`` 1, ``endpoint-delay``
10 and ``local-mem-bw`` the GPU's HBM bandwidth.

What the simulator does with them (astra-sim 518bd513 and its astra-network-analytical
submodule; every rule below reproduced its timings to the nanosecond on single
collectives, ``benchmarks/bench_collectives.py``):

* A message from NPU a to NPU b crosses the first dimension in which their addresses
  differ (``MultiDimTopology::get_dim_to_transfer``; the address of NPU r is
  ``(r mod gpus_per_node, r div gpus_per_node)``, so ranks 7 and 8 talk over NVLink)
  and takes ``floor(2 * latency + bytes / bandwidth)`` ns (a ``Switch`` is two links,
  ``BasicTopology::compute_communication_delay``).  A send is one such message.
* A collective on a group smaller than the world runs ONE ring over the group's
  members in the order ``comm_groups.json`` lists them
  (``CommunicatorGroup::get_collective_plan``).  The data is cut into 4 chunks
  (``Sys::determine_chunk_size``: a chunk is at least the world size in bytes, except
  for all-gather) that run one after the other.  In a chunk every member sends
  ``steps`` messages to its successor, each after it received the previous one
  (``Ring.cc``): all-reduce ``2(n-1)`` messages of chunk/n, reduce-scatter ``n-1`` of
  chunk/n, all-gather ``n-1`` of the chunk, all-to-all ``n(n-1)/2`` of chunk/n.  Every
  packet passes the memory bus first (10 ns, ``MemBus``); a packet that is reduced
  (reduce-scatter's, and all-reduce's first n-1) also costs reading two and writing one
  message at ``local-mem-bw`` (``PacketBundle::call``).
* A collective on the whole world runs per chunk one phase per network dimension
  (``Sys::generate_collective``): all-reduce under ``localBWAware`` reduce-scatters on
  the lower dimensions, all-reduces on the highest and all-gathers back down;
  all-gather goes from the highest dimension down, the others up.  Each dimension
  works on one chunk at a time; chunks flow through the phases, so a dimension takes
  the phase that has waited longest.
* Each member starts its ring when it issues the collective, not when the last member
  does; a message that reaches a member before that member has started is taken when
  it starts (its receive is posted with its first send).  Members that issued early
  therefore finish earlier than the late ones (:meth:`Network.collective_finish_ns`;
  a tied-embedding all-reduce whose members issue 100 us apart finishes 1891 ns apart,
  as the simulator has it: ``tests/integration/test_estimate_vs_simulator.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from stage_core.records import HardwareSpec, LinkSpec

#: system.json values the ASTRA-sim adapter writes (its configs.system_config reads them from here)
DATASET_SPLITS = 4  # "preferred-dataset-splits"
ENDPOINT_DELAY_NS = 10  # "endpoint-delay"; the memory bus of a ring on a group ("Fast") charges the same 10 ns
#: a Switch charges two links per message (astra-network-analytical Switch::compute_hops_count)
SWITCH_HOPS = 2
#: a reduced packet reads two messages and writes one (astra-sim PacketBundle::call)
REDUCE_PASSES = 3

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def backend_bandwidth(link: LinkSpec) -> float:
    """The bandwidth the adapter writes for ``link``: achieved GiB/s, two decimals
    (astra-network-analytical reads GB/s of 2^30 bytes, ``BasicTopology::bw_GBps_to_Bpns``)."""
    return round(link.bytes_per_second / 2**30, 2)


def dimensions(hw: HardwareSpec, world: int) -> tuple[tuple[int, LinkSpec], ...]:
    """The network's dimensions for ``world`` NPUs of ``hw``: ``(npus, link)`` each.

    One node (``world <= gpus_per_node``): one dimension of ``world`` NPUs on the
    scale-up link.  Above: the node's ``gpus_per_node`` on the scale-up link, then
    ``world // gpus_per_node`` nodes on the scale-out link (the adapter refuses a world
    that is not a multiple of a node before it gets here); with one rank a node (a CPU
    cluster) only the nodes, since the simulator refuses a dimension of one NPU.
    """
    node = hw.gpus_per_node
    if world <= node:
        return ((world, hw.scale_up),)
    if node == 1:
        return ((world, hw.scale_out),)
    return ((node, hw.scale_up), (world // node, hw.scale_out))


@dataclass(frozen=True)
class Dimension:
    npus: int
    bytes_per_ns: float
    latency_ns: float

    def message_ns(self, size: int) -> int:
        return math.floor(SWITCH_HOPS * self.latency_ns + size / self.bytes_per_ns)


@dataclass(frozen=True)
class Network:
    """ASTRA-sim's analytical network and system settings for ``world`` NPUs of ``hw``."""

    world: int
    dims: tuple[Dimension, ...]
    mem_bytes_per_ns: float  # local-mem-bw

    @classmethod
    def of(cls, hw: HardwareSpec, world: int) -> "Network":
        dims = tuple(Dimension(npus, backend_bandwidth(link) * 2**30 / 1e9, link.latency_ns)
                     for npus, link in dimensions(hw, world))
        return cls(world, dims, hw.gpu.hbm_gbps)

    def dim_between(self, a: int, b: int) -> int:
        """The dimension a message from NPU ``a`` to NPU ``b`` crosses."""
        for i, d in enumerate(self.dims):
            if a % d.npus != b % d.npus:
                return i
            a //= d.npus
            b //= d.npus
        raise ValueError(f"NPUs {a} and {b} are one NPU")

    def message_ns(self, a: int, b: int, size: int) -> int:
        """A send of ``size`` bytes from ``a`` to ``b``."""
        return self.dims[self.dim_between(a, b)].message_ns(size)

    def reduce_ns(self, size: int) -> int:
        return REDUCE_PASSES * math.floor(size / self.mem_bytes_per_ns)

    def chunk_bytes(self, kind: str, size: int) -> int:
        chunk = size // DATASET_SPLITS
        if kind != "all_gather" and self.world > chunk:
            chunk = self.world
        return chunk

    def collective_ns(self, kind: str, size: int, members: Sequence[int]) -> int:
        """A collective of ``size`` bytes (ASTRA-sim's comm_size) on ``members`` (in
        comm_groups.json order), from the moment every member has issued it."""
        return _collective_ns(self, kind, size, tuple(members))

    def largest_message(self, kind: str, size: int, members: Sequence[int]) -> int:
        """The largest message (bytes) one member sends to another in this collective: what
        a network backend is handed at once (ASTRA-sim's ``sim_send`` count)."""
        if kind not in KINDS:
            raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
        n = len(members)
        if n < 2:
            return 0
        chunk = self.chunk_bytes(kind, size)
        if n < self.world or len(self.dims) == 1:
            return _ring_plan(kind, chunk, n)[1]
        return max(_ring_plan(k, d, self.dims[i].npus)[1]
                   for k, i, d in _world_phases(self, kind, chunk) if self.dims[i].npus > 1)

    def collective_finish_ns(self, kind: str, size: int, members: Sequence[int],
                             starts: Sequence[float]) -> tuple[float, ...]:
        """When each member of a collective that member i issued at ``starts[i]`` completes it.

        On a ring (a group, or the world on one dimension) every member starts on its
        own; the whole world on several dimensions is taken to start at the last issue
        (its phases are not modelled member by member)."""
        first = min(starts)
        rel = tuple(s - first for s in starts)
        if not any(rel):
            return (first + self.collective_ns(kind, size, members),) * len(rel)
        return tuple(first + t for t in _collective_finish(self, kind, size, tuple(members), rel))


@lru_cache(maxsize=4096)
def _collective_finish(net: Network, kind: str, size: int, members: tuple[int, ...],
                       starts: tuple[float, ...]) -> tuple[float, ...]:
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
    n = len(members)
    if n < 2:
        return starts
    if n == net.world and len(net.dims) > 1:
        last = max(starts)
        return (last + _world_ns(net, kind, net.chunk_bytes(kind, size)),) * n
    dims = [net.dims[i] for i in _hops(net, members)]
    return tuple(_ring_finish(net, kind, net.chunk_bytes(kind, size), dims, DATASET_SPLITS, starts))


@lru_cache(maxsize=4096)
def _collective_ns(net: Network, kind: str, size: int, members: tuple[int, ...]) -> int:
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
    n = len(members)
    if n < 2:
        return 0
    chunk = net.chunk_bytes(kind, size)
    if n < net.world or len(net.dims) == 1:
        dims = [net.dims[i] for i in _hops(net, members)]
        return _ring_chunks(net, kind, chunk, dims, DATASET_SPLITS)
    return _world_ns(net, kind, chunk)


@lru_cache(maxsize=1024)
def _hops(net: Network, members: tuple[int, ...]) -> tuple[int, ...]:
    """The dimension each hop of the ring over ``members`` crosses (:meth:`Network.dim_between`)."""
    a = np.array(members, dtype=np.int64)
    b = np.roll(a, -1)
    dim = np.full(len(a), -1)
    for i, d in enumerate(net.dims):
        dim = np.where((dim < 0) & (a % d.npus != b % d.npus), i, dim)
        a, b = a // d.npus, b // d.npus
    return tuple(int(x) for x in dim)


def _ring_plan(kind: str, chunk: int, n: int) -> tuple[int, int, int]:
    """(messages each member sends, bytes per message, messages reduced first)."""
    if kind == "all_reduce":
        return 2 * (n - 1), chunk // n, n - 1
    if kind == "reduce_scatter":
        return n - 1, chunk // n, n - 1
    if kind == "all_gather":
        return n - 1, chunk, 0
    return n * (n - 1) // 2, chunk // n, 0


def _ring_chunks(net: Network, kind: str, chunk: int, dims: Sequence[Dimension], chunks: int) -> int:
    """``chunks`` chunks one after the other through a ring whose i-th member sends to
    the next over ``dims[i]``, every member starting at 0: when the last member is done."""
    steps, msg, reduced = _ring_plan(kind, chunk, len(dims))
    if len(set(dims)) == 1:  # every hop alike: all members move in step
        per = steps * (ENDPOINT_DELAY_NS + dims[0].message_ns(msg)) + ENDPOINT_DELAY_NS \
            + reduced * net.reduce_ns(msg)
        return chunks * per
    return max(_ring_finish(net, kind, chunk, dims, chunks, [0] * len(dims)))


def _ring_finish(net: Network, kind: str, chunk: int, dims: Sequence[Dimension], chunks: int,
                 starts: Sequence[float]) -> list[float]:
    """As :func:`_ring_chunks`, member i starting at ``starts[i]``: when each member is done."""
    n = len(dims)
    steps, msg, reduced = _ring_plan(kind, chunk, n)
    reduce = net.reduce_ns(msg)
    times = {d: d.message_ns(msg) for d in set(dims)}
    wire = [times[d] for d in dims]
    start = list(starts)
    for _ in range(chunks):
        send = [s + ENDPOINT_DELAY_NS for s in start]  # the first packet passes the memory bus
        got = send
        for k in range(1, steps + 1):
            # member i receives from i-1 once it has posted the receive (with its own k-th send)
            got = [max(send[i - 1] + wire[i - 1], send[i]) for i in range(n)]
            extra = ENDPOINT_DELAY_NS + (reduce if k <= reduced else 0)
            send = [g + extra for g in got]
        start = send
    return start


def _world_phases(net: Network, kind: str, chunk: int) -> list[tuple[str, int, int]]:
    """A whole-world collective's phases on a multi-dimensional network, in order:
    ``(ring kind, dimension, bytes of the chunk on that dimension)``."""
    sizes = [d.npus for d in net.dims]
    last = len(sizes) - 1
    phases, data = [], chunk
    if kind == "all_reduce":  # localBWAware
        for i in range(last):
            phases.append(("reduce_scatter", i, data))
            data //= sizes[i]
        phases.append(("all_reduce", last, data))
        for i in range(last - 1, -1, -1):
            phases.append(("all_gather", i, data))
    elif kind == "all_gather":
        for i in range(last, -1, -1):
            phases.append(("all_gather", i, data))
            data *= sizes[i]
    else:
        for i in range(last + 1):
            phases.append((kind, i, data))
            if kind == "reduce_scatter":
                data //= sizes[i]
    return phases


def _world_ns(net: Network, kind: str, chunk: int) -> int:
    """A collective on every NPU of a multi-dimensional network: per chunk a phase per
    dimension, each dimension serving one phase at a time, the longest-waiting first."""
    sizes = [d.npus for d in net.dims]
    phases = _world_phases(net, kind, chunk)
    times = [_ring_chunks(net, k, d, [net.dims[i]] * sizes[i], 1) if sizes[i] > 1 else 0
             for k, i, d in phases]
    free = [0] * len(sizes)  # when each dimension is next free
    ready = [(0, c, 0) for c in range(DATASET_SPLITS)]  # (ready time, chunk, phase)
    finish = 0
    while ready:
        ready.sort()
        # the dimension that frees first takes its longest-waiting phase
        best = None
        for r in ready:
            dim = phases[r[2]][1]
            start = max(r[0], free[dim])
            if best is None or (start, r[0], r[1]) < best[0]:
                best = ((start, r[0], r[1]), r)
        (start, _, _), r = best
        ready.remove(r)
        _, c, j = r
        dim = phases[j][1]
        end = start + times[j]
        free[dim] = end
        if j + 1 < len(phases):
            ready.append((end, c, j + 1))
        else:
            finish = max(finish, end)
    return finish


# --------------------------------------------------------------------------- a step's breakdown


def merged(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """``spans`` (start, end) sorted and joined where they touch or overlap."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(spans: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _overlap(x: Sequence[tuple[float, float]], y: Sequence[tuple[float, float]]) -> float:
    """Time two merged span lists share."""
    total, i, j = 0, 0, 0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def step_breakdown(compute: Iterable[tuple[float, float]], slot: Iterable[tuple[float, float]],
                   finish: float) -> tuple[float, float, float]:
    """One rank's step as ``(compute, exposed communication, bubble)``; they add up to ``finish``.

    ``compute``: when a kernel runs; ``slot``: when a send or collective holds the one
    communication slot.  *Compute* is the time some kernel runs, *exposed
    communication* the time the slot is busy while no kernel runs, *bubble* the rest
    (waiting on a receive, or on nothing issuable).
    """
    kernels, comm = merged(compute), merged(slot)
    busy = _length(kernels)
    exposed = _length(comm) - _overlap(comm, kernels)
    return busy, exposed, max(0, finish - busy - exposed)
