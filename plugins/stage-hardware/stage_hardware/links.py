"""A hardware preset's links fitted to measured collective times, as ASTRA-sim's analytical
network times them (``stage calibrate COLLECTIVES.csv``).

Each measured point (:class:`~.tables.CollectivePoint`) is timed by the core's copy of the
simulator's analytical network (``stage_core.api.netmodel``, equal to ASTRA-sim to the
nanosecond): ``ranks_per_node`` GPUs of each of ``ranks / ranks_per_node`` nodes, in ring
order with odd nodes reversed, so each crossing joins two GPUs of one local index (ASTRA-sim
sends a message over the first dimension in which two addresses differ; NCCL's rings cross
nodes between GPUs of one index); a group of every GPU of several nodes is the simulator's
whole-world collective.  A tier's efficiency and latency per link are the pair with the
smallest mean relative error: first the links inside a node on the points of one node,
then the links across nodes, given those, on the others.  Coarse grids, then finer ones
around the best.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from stage_core.api import netmodel
from stage_core.records import HardwareSpec

from .tables import CollectivePoint

#: the first grids: efficiency 0.05 to 1, latency 25 ns to 51 us (factors of 1.5)
EFFICIENCIES = tuple(np.round(np.arange(0.05, 1.0001, 0.05), 2))
LATENCIES = tuple(float(round(25 * 1.5**i)) for i in range(19))


def members(ranks: int, per_node: int, node: int) -> list[int]:
    out: list[int] = []
    for j in range(ranks // per_node):
        local = range(per_node) if j % 2 == 0 else range(per_node - 1, -1, -1)
        out += [j * node + i for i in local]
    return out


def model_seconds(hw: HardwareSpec, p: CollectivePoint) -> float:
    """``p`` timed on ``hw``'s network as ASTRA-sim's analytical backend times it."""
    node = hw.gpus_per_node
    if p.ranks_per_node > node:
        raise ValueError(f"{p.ranks_per_node} GPUs per node on a preset of {node}")
    group = members(p.ranks, p.ranks_per_node, node)
    nodes = len({r // node for r in group})
    net = netmodel.Network.of(hw, max(node * nodes, 2))
    if p.op == "send":
        return net.message_ns(group[0], group[1], p.bytes) * 1e-9
    return net.collective_ns(p.op, p.bytes, group) * 1e-9


def errors(hw: HardwareSpec, points: Sequence[CollectivePoint]) -> np.ndarray:
    return np.array([model_seconds(hw, p) / p.seconds - 1 for p in points])


def _with(hw: HardwareSpec, tier: str, efficiency: float, latency: float) -> HardwareSpec:
    link = dataclasses.replace(getattr(hw, tier), efficiency=float(efficiency), latency_ns=float(latency))
    return dataclasses.replace(hw, **{tier: link})


def fit_tier(hw: HardwareSpec, tier: str, points: Sequence[CollectivePoint]) -> tuple[float, float, float]:
    """(efficiency, latency ns, mean |relative error|) of ``tier`` that best explain ``points``."""
    def score(eff, lat):
        return float(np.mean(np.abs(errors(_with(hw, tier, eff, lat), points))))

    best = min((score(e, lat), e, lat) for e in EFFICIENCIES for lat in LATENCIES)
    for step_eff, step_lat in ((0.01, 0.1), (0.01, 0.02)):  # then finer, around the best
        _, e0, l0 = best
        effs = [round(e0 + k * step_eff, 2) for k in range(-4, 5) if 0 < round(e0 + k * step_eff, 2) <= 1]
        lats = [round(l0 * (1 + k * step_lat)) for k in range(-4, 5)]
        best = min([best] + [(score(e, lat), e, lat) for e in effs for lat in lats if lat > 0])
    error, efficiency, latency = best
    return float(efficiency), float(latency), error


def fit(hw: HardwareSpec, points: Sequence[CollectivePoint]) -> tuple[HardwareSpec, dict[str, tuple]]:
    """``hw`` with the links ``points`` determine; {tier: (efficiency, latency, mean error, points)}."""
    inside = [p for p in points if p.ranks == p.ranks_per_node]
    across = [p for p in points if p.ranks != p.ranks_per_node]
    fitted: dict[str, tuple] = {}
    for tier, mine in (("scale_up", inside), ("scale_out", across)):
        if not mine:
            continue
        efficiency, latency, error = fit_tier(hw, tier, mine)
        hw = _with(hw, tier, efficiency, latency)
        fitted[tier] = (efficiency, latency, error, len(mine))
    return hw, fitted
