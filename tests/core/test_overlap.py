"""Background communication in the one communication slot: hand-built programs."""

import pytest

from stage_core.parallel.overlap import MIN_PIECE_BYTES, WINDOW_USE, Background, is_slot, place
from stage_core.trace import CollectiveType, NodeType, ProgramNode

MB = 1 << 20


def comp(i, deps=()):
    return ProgramNode(i, f"c{i}", NodeType.COMP, tuple(deps), num_ops=1, tensor_size=1)


def coll(i, deps=(), size=MB, name=None):
    return ProgramNode(i, name or f"tp{i}", NodeType.COMM_COLL, tuple(deps), comm_type=CollectiveType.ALL_REDUCE,
                       comm_size=size, group="tp")


def send(i, deps=()):
    return ProgramNode(i, f"send{i}", NodeType.COMM_SEND, tuple(deps), comm_size=MB, peer="pp-1", tag=1)


# every compute node takes 1 ms; a collective takes 1 ms per MB; 1 MB per ms fits
SECONDS = {"compute": lambda n: 1e-3, "comm": lambda n, size: size / MB * 1e-3,
           "bytes": lambda n, s: int(s / 1e-3 * MB)}


def timed(nodes, background):
    out, anchors = place(nodes, background, SECONDS["compute"], SECONDS["comm"], SECONDS["bytes"])
    assert anchors == sorted(anchors) and len(anchors) == len(out)
    return out


def backward_with_a_bucket(size):
    """c0 c1 | tp2 | c3 c4 c5 | tp6 | c7 | send8, and a bucket (9) ready after c1, needed by the optimizer (10)."""
    nodes = [comp(0), comp(1, [0]), coll(2, [1]), comp(3, [2]), comp(4, [3]), comp(5, [4]), coll(6, [5]),
             comp(7, [6]), send(8, [7]), coll(9, [1], size=size, name="bucket"), comp(10, [9])]
    return nodes, {9: Background(9, release=1, group_size=2)}


def chain_of(nodes):
    return [n for n in nodes if is_slot(n)]


def assert_chained_and_topological(nodes):
    for i, n in enumerate(nodes):
        assert n.id == i
        assert all(d < i for d in (*n.data_deps, *n.ctrl_deps)), n
    slots = chain_of(nodes)
    for before, after in zip(slots, slots[1:]):
        assert before.id in after.ctrl_deps or before.id in after.data_deps, (before.name, after.name)


def test_a_bucket_is_cut_to_the_windows_after_its_release():
    nodes, bg = backward_with_a_bucket(10 * MB)
    out, _ = place(nodes, bg, lambda n: 2e-3, SECONDS["comm"], SECONDS["bytes"])  # 2 ms kernels
    assert_chained_and_topological(out)
    names = [n.name for n in chain_of(out)]
    # windows: tp2..tp6 holds 6 ms of compute, tp6..send8 2 ms; WINDOW_USE of each is filled,
    # in whole 4-byte elements on each of the 2 ranks
    first, second = int(6 * WINDOW_USE * MB) // 8 * 8, int(2 * WINDOW_USE * MB) // 8 * 8
    assert names == ["tp2", "bucket:part1of3", "tp6", "bucket:part2of3", "send8", "bucket:part3of3"]
    parts = [n for n in out if n.name.startswith("bucket")]
    assert [p.comm_size for p in parts] == [first, second, 10 * MB - first - second]
    # each piece runs right after the foreground communication that opens its window
    assert [out[p.id - 1].name for p in parts] == ["tp2", "tp6", "send8"]
    # the optimizer waits for every piece
    optimizer = out[-1]
    assert set(optimizer.data_deps) == {p.id for p in parts}


def test_a_window_too_small_for_a_piece_is_skipped_and_a_small_bucket_fits_one():
    nodes, bg = backward_with_a_bucket(2 * MB)  # 1 ms kernels: 2.4 MB fit after tp2, 0.8 MB after tp6
    out = timed(nodes, bg)
    assert [n.name for n in chain_of(out)] == ["tp2", "bucket", "tp6", "send8"]
    assert out[[n.name for n in out].index("bucket")].comm_size == 2 * MB


def test_without_times_background_goes_after_the_last_foreground_communication():
    nodes, bg = backward_with_a_bucket(10 * MB)
    out, anchors = place(nodes, bg)
    assert_chained_and_topological(out)
    assert anchors == [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 10]  # the bucket follows send8
    assert [n.name for n in chain_of(out)] == ["tp2", "tp6", "send8", "bucket"]


def test_with_nothing_foreground_after_it_a_bucket_goes_at_its_release():
    # data parallel only: no collective or send follows the bucket, so it runs as soon as it is ready
    nodes = [comp(0), comp(1, [0]), coll(2, [1], size=8 * MB, name="bucket"), comp(3, [1]), comp(4, [2, 3])]
    out, _ = place(nodes, {2: Background(2, release=1, group_size=2)})
    assert [n.name for n in out] == ["c0", "c1", "bucket", "c3", "c4"]


def test_windows_smaller_than_a_piece_are_skipped():
    nodes, bg = backward_with_a_bucket(10 * MB)
    tiny = {"compute": lambda n: 1e-6}  # 1 us of compute per kernel: no window holds MIN_PIECE_BYTES
    out, _ = place(nodes, bg, tiny["compute"], SECONDS["comm"], SECONDS["bytes"])
    assert [n.name for n in chain_of(out)] == ["tp2", "tp6", "send8", "bucket"]
    assert MIN_PIECE_BYTES == MB


def test_a_gather_is_prefetched_into_the_previous_layer_and_done_before_its_layer():
    # layer 0: gather0 c1 tp2 c3 c4 tp5 c6 | layer 1: gather7 c8 tp9; gather7 released by gather0
    nodes = [coll(0, name="gather0", size=MB), comp(1, [0]), coll(2, [1]), comp(3, [2]), comp(4, [3]),
             coll(5, [4]), comp(6, [5]), coll(7, name="gather1", size=3 * MB), comp(8, [6, 7]), coll(9, [8])]
    bg = {0: Background(0, release=-1, group_size=2), 7: Background(7, release=0, group_size=2)}
    out = timed(nodes, bg)
    assert_chained_and_topological(out)
    # gather1 runs in layer 0's window tp2..tp5 (2 ms of compute: 1.6 MB) and the rest after
    # tp5, the last foreground communication before layer 1 needs it
    assert [n.name for n in chain_of(out)] == ["gather0", "tp2", "gather1:part1of2", "tp5", "gather1:part2of2",
                                               "tp9"]
    c8 = next(n for n in out if n.name == "c8")
    assert {out[d].name for d in c8.data_deps} >= {"gather1:part1of2", "gather1:part2of2"}


@pytest.mark.parametrize("size", [1, 3 * MB, 10 * MB, 100 * MB])
def test_pieces_add_up_and_respect_whole_elements(size):
    nodes, bg = backward_with_a_bucket(size)
    out = timed(nodes, bg)
    parts = [n for n in out if n.name.startswith("bucket")]
    assert sum(p.comm_size for p in parts) == size
    assert all(p.comm_size % 8 == 0 for p in parts[:-1])  # 4 bytes x 2 ranks
