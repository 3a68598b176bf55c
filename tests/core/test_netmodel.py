"""stage_core.netmodel: the analytical network's times against ASTRA-sim's own and hand
arithmetic, the largest message a collective hands the network, and a step's breakdown.

MEASURED holds finish times (ns) of single collectives and sends that the real simulator
gave (astra-sim 518bd513, AstraSim_Analytical_Congestion_Unaware, with the configs the
ASTRA-sim adapter writes for the h100 preset); tests/integration/test_estimate.py runs
some of them again in the simulator itself.
"""

import dataclasses
import math

import pytest

from stage_core.netmodel import Network, backend_bandwidth, dimensions, step_breakdown
from stage_core.records import GpuSpec, HardwareSpec, LinkSpec

#: the h100 preset's numbers (stage-hardware), here so that these tests need no plugin
H100 = HardwareSpec(
    name="h100", description="", gpus_per_node=8,
    gpu=GpuSpec(name="h100", description="", matmul_tflops={"bf16": 989.4}, vector_tflops=66.9, hbm_gbps=3350.0,
                sm_count=132),
    scale_up=LinkSpec("NVLink 4", 450.0, 400 * 2**30 / 450e9, 936.25),
    scale_out=LinkSpec("InfiniBand NDR", 50.0, 400 * 2**30 / 450e9, 2643.5))

AR, AG, RS, A2A = "all_reduce", "all_gather", "reduce_scatter", "all_to_all"
MiB = 1 << 20

# (world, members, collective, comm_size, finish ns in ASTRA-sim)
MEASURED = [
    (8, [0, 1], AR, 4096, 15104), (8, [0, 1], AR, 64 * MiB, 201392),
    (8, [0, 1, 2, 3], AR, MiB, 49564), (8, list(range(8)), AR, 64 * MiB, 431464),
    (8, [0, 1, 2, 3], AG, MiB, 29944), (8, list(range(8)), AG, 64 * MiB, 1146500),
    (8, [0, 1], RS, MiB, 9256), (8, list(range(8)), RS, 4096, 52736),
    (8, [0, 1, 2, 3], A2A, 64 * MiB, 279592), (8, list(range(8)), A2A, MiB, 219336),
    # groups across nodes: ranks 7 and 8 differ in their first address digit (NVLink),
    # 0 and 8 only in the second (InfiniBand); the ring follows comm_groups.json's order
    (16, [7, 8], AG, 64 * MiB, 163820), (16, [0, 8], AR, 64 * MiB, 1478848),
    (16, [0, 4, 8, 12], AG, 64 * MiB, 491380), (16, [0, 8, 1, 9], AG, 64 * MiB, 2387074),
    (16, [0, 8, 1, 9], AR, 64 * MiB, 1303240), (16, list(range(12)), AG, 64 * MiB, 1801620),
    # the whole world of two dimensions: a phase per dimension, chunks pipelined
    (16, list(range(16)), AR, 64 * MiB, 431504), (16, list(range(16)), AG, 64 * MiB, 2597140),
    (16, list(range(16)), RS, 64 * MiB, 270264), (16, list(range(16)), A2A, 64 * MiB, 938825),
    (24, list(range(24)), AR, MiB, 116133), (32, list(range(32)), AR, 64 * MiB, 504348),
    (32, list(range(32)), AG, 4096, 77110), (64, list(range(64)), AR, MiB, 329137),
]


@pytest.mark.parametrize("world, members, kind, size, ns", MEASURED)
def test_collectives_take_what_astra_sim_says(world, members, kind, size, ns):
    assert Network.of(H100, world).collective_ns(kind, size, members) == ns


@pytest.mark.parametrize("src, dst, size, ns", [(0, 1, 4096, 1882), (0, 1, 64 * MiB, 158122), (7, 8, MiB, 4313),
                                                (0, 8, 4096, 5372), (0, 8, 64 * MiB, 1411677)])
def test_a_send_is_one_message_over_the_first_dimension_that_differs(src, dst, size, ns):
    assert Network.of(H100, 16).message_ns(src, dst, size) == ns


def test_an_all_reduce_by_hand():
    """4 ranks in a node, 1 MiB: 4 chunks of 256 KiB, each 6 messages of 64 KiB around the
    ring; every packet passes the memory bus (10 ns), the first 3 received are reduced
    (3 passes over 64 KiB at 3350 B/ns)."""
    bw = backend_bandwidth(H100.scale_up) * 2**30 / 1e9
    assert backend_bandwidth(H100.scale_up) == 400.0
    wire = math.floor(2 * 936.25 + 65536 / bw)
    reduce = 3 * math.floor(65536 / 3350.0)
    per_chunk = 6 * (10 + wire) + 10 + 3 * reduce
    assert Network.of(H100, 8).collective_ns(AR, MiB, [0, 1, 2, 3]) == 4 * per_chunk == 49564


def test_small_collectives_move_at_least_the_world_in_bytes_per_chunk():
    """A chunk is at least the world size in bytes (all-gather aside): 4 chunks of 64 bytes
    on 64 ranks, in which an all-reduce between 2 ranks moves 32-byte messages."""
    net = Network.of(H100, 64)
    bw = backend_bandwidth(H100.scale_up) * 2**30 / 1e9
    per_chunk = 2 * (10 + math.floor(2 * 936.25 + 32 / bw)) + 10 + 3 * math.floor(32 / 3350.0)
    assert net.chunk_bytes(AR, 8) == 64 and net.chunk_bytes(AG, 8) == 2
    assert net.collective_ns(AR, 8, [0, 1]) == 4 * per_chunk


def test_a_group_of_one_costs_nothing():
    assert Network.of(H100, 8).collective_ns(AR, MiB, [3]) == 0


def test_a_member_that_issues_early_finishes_one_message_earlier():
    """2 ranks, 64 KiB all-reduce, rank 1 issuing long after rank 0.  In each of the 4
    chunks rank 0's first message is already waiting when rank 1 starts, so both send
    at once from then on and rank 1's last message reaches rank 0 one message (8 KiB)
    before rank 0's reaches rank 1; rank 0 starts the next chunk that much ahead, and
    finds rank 1's message there again.  Rank 1 finishes as if both had started with
    it; rank 0 one message earlier."""
    net = Network.of(H100, 8)
    wire = net.message_ns(0, 1, 8192)
    late = 100_000 + net.collective_ns(AR, 65536, [0, 1])
    assert net.collective_finish_ns(AR, 65536, [0, 1], [0, 100_000]) == (late - wire, late)


def test_members_issuing_apart_finish_apart_as_astra_sim_has_them():
    """gpt-tiny tp2 pp2 dp2 --zero 1 (tests/integration/test_estimate_vs_simulator.py): the
    tied embedding's gradient all-reduce between ranks 0 and 4, issued at these ticks;
    the simulator completed it at 1125454 on rank 0 and 1123563 on rank 4."""
    net = Network.of(H100, 8)
    assert net.collective_finish_ns(AR, 65536, [0, 4], [1110182, 1007814]) == (1125454, 1123563)


def test_members_issuing_together_take_the_collective_time():
    net = Network.of(H100, 16)
    assert net.collective_finish_ns(AG, MiB, [0, 8, 1, 9], [5] * 4) == (5 + net.collective_ns(AG, MiB, [0, 8, 1, 9]),) * 4


def test_dimensions_are_a_node_then_the_nodes():
    assert dimensions(H100, 4) == ((4, H100.scale_up),)
    assert dimensions(H100, 8) == ((8, H100.scale_up),)
    assert dimensions(H100, 32) == ((8, H100.scale_up), (4, H100.scale_out))


def test_one_rank_a_node_is_one_dimension_of_the_nodes():
    # a CPU cluster (Das et al. 2016's: one rank a node): the simulator refuses a dimension of one NPU
    cpus = dataclasses.replace(H100, gpus_per_node=1)
    assert dimensions(cpus, 1) == ((1, cpus.scale_up),)
    assert dimensions(cpus, 16) == ((16, cpus.scale_out),)
    assert [d.npus for d in Network.of(cpus, 16).dims] == [16]


@pytest.mark.parametrize("world, members, kind, size, largest", [
    # a ring on a group: all-reduce and reduce-scatter send chunk/n, all-gather the chunk
    (8, [0, 1, 2, 3], AR, 4 * MiB, MiB // 4), (8, [0, 1], AG, 4 * MiB, MiB),
    (8, [0, 1, 2, 3], RS, 4 * MiB, MiB // 4), (8, [0, 1, 2, 3], A2A, 4 * MiB, MiB // 4),
    # the world on [8, 2]: all-reduce reduce-scatters 1 MiB chunks over 8 (128 KiB messages),
    # all-reduces 128 KiB over 2 (64 KiB), gathers back (128 KiB messages): 128 KiB at most
    (16, list(range(16)), AR, 4 * MiB, MiB // 8),
    # all-gather from the top: 1 MiB chunks over 2 nodes, then 2 MiB over the node
    (16, list(range(16)), AG, 4 * MiB, 2 * MiB),
    (8, [5], AR, MiB, 0),
])
def test_the_largest_message_a_collective_hands_the_network(world, members, kind, size, largest):
    assert Network.of(H100, world).largest_message(kind, size, members) == largest


def test_a_step_breaks_down_into_compute_exposed_communication_and_bubble():
    """Kernels 0-4 and 6-8 (6 ns, overlapping spans merged); the slot busy 3-7 and 10-12:
    exposed while no kernel runs, 4-6 and 10-12 (4 ns); the rest of a 15 ns step (5 ns)
    is bubble."""
    assert step_breakdown([(0, 3), (2, 4), (6, 8)], [(3, 7), (10, 12)], 15) == (6, 4, 5)
    assert step_breakdown([], [], 5) == (0, 0, 5)
