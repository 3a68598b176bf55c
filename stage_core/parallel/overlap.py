"""Where background communication sits in a rank's one communication slot.

ASTRA-sim keeps one send or collective in flight per rank (receives aside), and
lowering chains them all in one order (the *chain*), so that order never depends
on timing.  Megatron runs two kinds of communication on streams of their own, off
the critical path: the data-parallel reduction of gradient buckets, and (ZeRO-3)
the gather of the next layer's parameters.  In one slot, such *background*
communication delays whatever *foreground* communication (a pipeline send, a
TP/CP/EP collective: what the next kernel waits for) is issued after it.

The rule, applied to each rank class's program once it is emitted:

* Foreground sends and collectives keep their emission order.
* A background collective may run from its *release* (its gradients are final;
  for a parameter gather, the previous layer's gather was issued: one layer of
  prefetch) to its *deadline* (the first node that needs it).
* Between two foreground communications lies a *window* of compute.  When the
  kernels are timed (``stage generate --gpu``), background collectives are cut
  into pieces that fit the windows after their release, by the compute model's
  times and the network's bandwidth (:func:`stage_core.hardware.transfer_seconds`),
  earliest deadline first; each piece is chained right after the foreground
  communication that opens its window, so it runs while the kernels of the window
  do and is done before the next foreground communication is ready.
* What does not fit goes after the last foreground communication before its
  deadline (or at its release, if that is later): nothing foreground waits
  behind it.

Issue order stays a pure function of the program: the chain is rebuilt over the
final order (each send or collective waits on the one before it).  Node ids are
renumbered in that order.
"""

from __future__ import annotations

from bisect import bisect_left

import dataclasses
from typing import Callable, Sequence

from ..trace import NodeType, ProgramNode

#: no piece smaller than this (a collective's fixed cost would dominate)
MIN_PIECE_BYTES = 1 << 20
#: the share of a window's compute time background pieces may fill: estimates of
#: collectives are textbook ring formulas, and a piece that overruns its window
#: delays the foreground communication that closes it
WINDOW_USE = 0.8
#: pieces are whole multiples of 4 bytes per group member (whole elements on every rank)
ELEMENT = 4


def is_slot(node: ProgramNode) -> bool:
    """Sends and collectives: what shares ASTRA-sim's one communication slot."""
    return node.type in (NodeType.COMM_COLL, NodeType.COMM_SEND)


@dataclasses.dataclass
class Background:
    """A background collective: emitted at node ``id``, free to run after node ``release``."""

    id: int
    release: int
    group_size: int


def place(nodes: Sequence[ProgramNode], background: dict[int, Background],
          compute_seconds: Callable[[ProgramNode], float] | None = None,
          comm_seconds: Callable[[ProgramNode, int], float] | None = None,
          comm_bytes: Callable[[ProgramNode, float], int] | None = None) -> tuple[list[ProgramNode], list[int]]:
    """The program with background collectives placed (and split) as the module says,
    the chain rebuilt and ids renumbered; and, per node of it, its *anchor*: the old
    position it sits at (a piece: the position it follows), non-decreasing, so the
    nodes that stand where old nodes ``0..b-1`` stood are the first
    ``bisect_left(anchors, b)``.

    ``compute_seconds(node)``: a compute node's time; ``comm_seconds(node, size)``: a
    send's or collective's time at ``size`` bytes; ``comm_bytes(node, seconds)``: the
    bytes of ``node``'s kind and group that fit in ``seconds``.  Without them no
    window is used.
    """
    n = len(nodes)
    elapsed = [0.0] * (n + 1)  # compute seconds before position i
    for i, node in enumerate(nodes):
        step = compute_seconds(node) if compute_seconds and node.type == NodeType.COMP else 0.0
        elapsed[i + 1] = elapsed[i] + step
    deadline = {b: n for b in background}
    for i, node in enumerate(nodes):
        for d in (*node.data_deps, *node.ctrl_deps):
            if d in deadline and deadline[d] > i:
                deadline[d] = i
    fore = [i for i, node in enumerate(nodes) if is_slot(node) and i not in background]

    # windows: (opens after node, closes before node, seconds left)
    windows: list[list] = []
    if compute_seconds and comm_seconds and comm_bytes:
        for k, start in enumerate(fore):
            end = fore[k + 1] if k + 1 < len(fore) else None
            if end is None:
                break
            seconds = elapsed[end] - elapsed[start + 1]
            if nodes[start].type == NodeType.COMM_SEND:  # the compute after a send does not wait for it
                seconds -= comm_seconds(nodes[start], nodes[start].comm_size)
            windows.append([start, end, seconds * WINDOW_USE])

    after: dict[int, list[ProgramNode]] = {}  # position -> pieces placed right after it
    replaced: dict[int, list[ProgramNode]] = {}  # background id -> its pieces
    for bid in sorted(background, key=lambda b: (deadline[b], background[b].release, b)):
        node, info = nodes[bid], background[bid]
        left = node.comm_size
        unit = ELEMENT * max(info.group_size, 1)
        pieces: list[tuple[int, int]] = []  # (after position, bytes)
        for w in windows:
            start, end, seconds = w
            if end > deadline[bid] or left == 0:
                break
            opens = max(start, info.release)
            if opens >= end:
                continue
            avail = (elapsed[end] - elapsed[opens + 1]) * WINDOW_USE if opens > start else seconds
            avail = min(avail, seconds)
            if avail <= 0:
                continue
            size = min(left, comm_bytes(node, avail) // unit * unit)
            if size < MIN_PIECE_BYTES and size < left:
                continue
            if size <= 0:
                continue
            pieces.append((opens, size))
            w[2] -= comm_seconds(node, size)
            left -= size
        if left:
            k = bisect_left(fore, deadline[bid])  # fore is ascending: the last one before the deadline
            last_fore = fore[k - 1] if k else -1
            pieces.append((max(last_fore, info.release), left))
        made = []
        for j, (pos, size) in enumerate(pieces):
            name = node.name if len(pieces) == 1 else f"{node.name}:part{j + 1}of{len(pieces)}"
            piece = dataclasses.replace(node, name=name, comm_size=size)
            after.setdefault(pos, []).append(piece)
            made.append(piece)
        replaced[bid] = made

    # the final order: every node but the background ones, pieces right after their position
    order: list[tuple[int | None, ProgramNode]] = [(None, p) for p in after.get(-1, ())]
    anchors = [-1] * len(order)
    for i, node in enumerate(nodes):
        if i not in background:
            order.append((i, node))
            anchors.append(i)
        order.extend((None, p) for p in after.get(i, ()))
        anchors.extend(i for _ in after.get(i, ()))
    new_id: dict[int, list[int]] = {}
    piece_id: dict[int, int] = {}
    for pos, (old, node) in enumerate(order):
        if old is not None:
            new_id[old] = [pos]
        else:
            piece_id[id(node)] = pos
    for bid, made in replaced.items():
        new_id[bid] = [piece_id[id(p)] for p in made]

    out: list[ProgramNode] = []
    previous_slot: int | None = None
    for pos, (_, node) in enumerate(order):
        data = tuple(sorted({x for d in node.data_deps for x in new_id[d]}))
        ctrl = {x for d in node.ctrl_deps for x in new_id[d]}
        if is_slot(node) and previous_slot is not None and previous_slot not in data:
            ctrl.add(previous_slot)
        ctrl_deps = tuple(sorted(ctrl))
        if pos != node.id or data != node.data_deps or ctrl_deps != node.ctrl_deps:  # most nodes keep theirs
            node = dataclasses.replace(node, id=pos, data_deps=data, ctrl_deps=ctrl_deps)
        out.append(node)
        if is_slot(node):
            previous_slot = pos
    return out, anchors
