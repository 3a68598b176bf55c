"""Sends and receives: each peer is another rank, and every send meets its receive."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Mapping

from ..trace import NodeType, TraceNode
from .problems import Problems, Recorder
from .structure import attr_numbers

if TYPE_CHECKING:
    from .ranks import RankSummary


def check_peer(rank: int, node: TraceNode, world_size: int, summary: RankSummary,
               out: Recorder) -> None:
    """The rank part of a send or receive: its peer is another rank of the world."""
    is_send = node.type == NodeType.COMM_SEND
    peer_attr = "comm_dst" if is_send else "comm_src"
    numbers = attr_numbers(node, peer_attr, "comm_tag", "comm_size")
    if numbers is None:
        return
    peer = numbers[0]
    if not (peer == int(peer) and 0 <= peer < world_size):
        out.add(rank, node, f"{peer_attr} {peer} is not a rank (world size {world_size})")
    elif peer == rank:
        out.add(rank, node, f"{peer_attr} {peer} is the rank itself")
    else:
        (summary.sends if is_send else summary.recvs)[numbers].append((node.id, node.name))


def check_point_to_point(summaries: Mapping[int, RankSummary], out: Problems,
                         subset: bool = False) -> None:
    """Multiset matching: send(r -> d, tag, size) pairs with recv on d from r.

    In a ``subset`` of the world's ranks, a send or receive whose peer has no trace
    in the set has nothing to meet and is not reported."""
    unmatched_sends = _unmatched(summaries, "sends", "recvs", subset)
    unmatched_recvs = _unmatched(summaries, "recvs", "sends", subset)
    near_recv = _by_pair(unmatched_recvs)
    near_send = _by_pair(unmatched_sends)
    for rank, (peer, tag, size), nid, name in unmatched_sends:
        hint = _nearest(near_recv.get((peer, rank)), tag, size, "recv", f"src={rank}")
        out.at(rank, nid, name, f"send to rank {peer} (tag {tag}, {size} bytes) has no "
               f"matching recv on rank {peer}{hint}")
    for rank, (peer, tag, size), nid, name in unmatched_recvs:
        hint = _nearest(near_send.get((peer, rank)), tag, size, "send", f"dst={rank}")
        out.at(rank, nid, name, f"recv from rank {peer} (tag {tag}, {size} bytes) has no "
               f"matching send on rank {peer}{hint}")


def _unmatched(summaries: Mapping[int, RankSummary], mine: str, theirs: str,
               subset: bool) -> list:
    """(rank, (peer, tag, size), node id, name) of ``mine`` left without a partner."""
    left = []
    for rank, summary in summaries.items():
        for (peer, tag, size), nodes in getattr(summary, mine).items():
            other = summaries.get(peer)
            if other is None and subset:
                continue
            partners = getattr(other, theirs).get((rank, tag, size), ()) if other else ()
            for nid, name in nodes[len(partners):]:
                left.append((rank, (peer, tag, size), nid, name))
    return left


def _by_pair(unmatched: list) -> dict[tuple[int, int], list]:
    """Unmatched nodes indexed by (their rank, their peer)."""
    pairs: dict[tuple[int, int], list] = defaultdict(list)
    for rank, (peer, tag, size), nid, _ in unmatched:
        pairs[(rank, peer)].append((nid, tag, size))
    return pairs


def _nearest(candidates: list | None, tag: int, size: int, kind: str, peer: str) -> str:
    """Describe the unmatched partner-side node that looks meant for this one."""
    if not candidates:
        return ""
    nid, their_tag, their_size = min(
        candidates, key=lambda c: (c[1] != tag) + (c[2] != size))
    differs = [what for what, same in (("tag", their_tag == tag), ("size", their_size == size))
               if not same]
    return (f"; unmatched there: node {nid} {kind}({peer}, tag {their_tag}, "
            f"{their_size} bytes), {' and '.join(differs)} differ"
            + ("s" if len(differs) == 1 else ""))
