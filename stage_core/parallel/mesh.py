"""The device mesh: named axes, Megatron's rank order, process groups with stable ids.

The order string lists axes fastest-varying first (``"tp-cp-ep-dp-pp"``): rank r's
coordinate on the i-th axis is ``(r // stride_i) % degree_i`` with strides growing
along the string.  ep is not a factor of the world size (it is carved out of
dp×cp), so it takes no place in rank coordinates.

A process group along a *key* (one axis, or several joined by ``+`` such as
``"cp+dp"``) is the set of ranks that share every coordinate not in the key.  An
axis may be restricted to some of its coordinates, ``"pp@0,3"``: the first and last
pipeline stages (the ranks that hold a tied embedding).
Group ids are decimal strings from 1, computed from coordinates: the groups of
the keys in use are numbered key by key (in a fixed order), and within a key by
the coordinates outside the key, so the same plan always gives the same ids and
no search over ranks is needed.

Every per-rank function has an ``*_array`` twin that takes a numpy array of ranks
and answers for all of them at once, with the same arithmetic: a 131,072-rank job
resolves its groups and peers in milliseconds.
"""

from __future__ import annotations

from functools import cached_property
from typing import Iterable, Mapping

import numpy as np

from .plan import AXES, Plan

RANK_AXES = tuple(a for a in AXES if a != "ep")


def canonical_key(axes: Iterable[str]) -> str:
    axes = set(axes)
    unknown = axes - set(RANK_AXES)
    if unknown:
        raise ValueError(f"unknown mesh axes {sorted(unknown)}; known: {RANK_AXES}")
    return "+".join(a for a in RANK_AXES if a in axes)


class Mesh:
    def __init__(self, degrees: Mapping[str, int], order: str = "tp-cp-ep-dp-pp"):
        self.degrees = {a: int(degrees.get(a, 1)) for a in RANK_AXES}
        self.order = [a for a in order.split("-") if a != "ep"]
        self.strides: dict[str, int] = {}
        stride = 1
        for a in self.order:
            self.strides[a] = stride
            stride *= self.degrees[a]
        self.world_size = stride

    @classmethod
    def from_plan(cls, plan: Plan) -> "Mesh":
        return cls({a: plan.degree(a) for a in RANK_AXES}, plan.order)

    # ------------------------------------------------------------------ coordinates
    def coord(self, rank: int, axis: str) -> int:
        return (rank // self.strides[axis]) % self.degrees[axis]

    def coords(self, rank: int) -> dict[str, int]:
        return {a: self.coord(rank, a) for a in self.order}

    def rank(self, coords: Mapping[str, int]) -> int:
        return sum(coords.get(a, 0) * self.strides[a] for a in self.order)

    def coord_array(self, ranks: np.ndarray, axis: str) -> np.ndarray:
        return (np.asarray(ranks, dtype=np.int64) // self.strides[axis]) % self.degrees[axis]

    # ------------------------------------------------------------------ groups
    @staticmethod
    def _parts(key: str) -> list[tuple[str, tuple[int, ...] | None]]:
        out = []
        for part in key.split("+"):
            if not part:
                continue
            axis, _, coords = part.partition("@")
            out.append((axis, tuple(int(c) for c in coords.split(",")) if coords else None))
        return out

    def key_axes(self, key: str) -> list[str]:
        return [axis for axis, _ in self._parts(key)]

    def group_size(self, key: str) -> int:
        n = 1
        for axis, coords in self._parts(key):
            n *= len(coords) if coords is not None else self.degrees[axis]
        return n

    def num_groups(self, key: str) -> int:
        n = 1
        inside = set(self.key_axes(key))
        for a in self.order:
            if a not in inside:
                n *= self.degrees[a]
        return n

    def group_index(self, key: str, rank: int) -> int:
        """Index of rank's group among the groups of ``key`` (mixed radix over the other axes)."""
        inside = set(self.key_axes(key))
        index, radix = 0, 1
        for a in self.order:
            if a in inside:
                continue
            index += self.coord(rank, a) * radix
            radix *= self.degrees[a]
        return index

    def group_index_array(self, key: str, ranks: np.ndarray) -> np.ndarray:
        """:meth:`group_index` of every rank in ``ranks``."""
        inside = set(self.key_axes(key))
        ranks = np.asarray(ranks, dtype=np.int64)
        index, radix = np.zeros(ranks.shape, dtype=np.int64), 1
        for a in self.order:
            if a in inside:
                continue
            index += self.coord_array(ranks, a) * radix
            radix *= self.degrees[a]
        return index

    def all_group_members(self, key: str) -> np.ndarray:
        """Members of every group of ``key``: row ``g`` holds group ``g``'s ranks, ascending."""
        parts = dict(self._parts(key))
        base = np.zeros(1, dtype=np.int64)  # first rank of each group, in group_index order
        for a in self.order:
            if a not in parts:
                base = (base[None, :] + self.strides[a] * np.arange(self.degrees[a])[:, None]).ravel()
        offsets = np.zeros(1, dtype=np.int64)
        for a in self.order:
            if a in parts:
                coords = parts[a] if parts[a] is not None else range(self.degrees[a])
                offsets = (offsets[None, :] + self.strides[a] * np.asarray(coords)[:, None]).ravel()
        return base[:, None] + np.sort(offsets)[None, :]

    def group_members(self, key: str, rank: int) -> list[int]:
        parts = dict(self._parts(key))
        inside = [a for a in self.order if a in parts]
        base = rank - sum(self.coord(rank, a) * self.strides[a] for a in inside)
        members = [base]
        for a in inside:
            coords = parts[a] if parts[a] is not None else range(self.degrees[a])
            members = [m + i * self.strides[a] for i in coords for m in members]
        return sorted(members)

    def peer(self, rank: int, key: str) -> int:
        """The rank a send/recv with peer key ``"<axis>+<n>"`` or ``"<axis>-<n>"`` talks to;
        ``"<axis>%+<n>"`` and ``"<axis>%-<n>"`` count around the axis as a ring."""
        axis, delta, ring = self._peer_offset(key)
        c = self.coord(rank, axis) + delta
        if ring:
            c %= self.degrees[axis]
        elif not 0 <= c < self.degrees[axis]:
            raise ValueError(f"rank {rank} has no {axis} neighbour at offset {delta}")
        return rank + (c - self.coord(rank, axis)) * self.strides[axis]

    def peer_array(self, key: str, ranks: np.ndarray) -> np.ndarray:
        """:meth:`peer` of every rank in ``ranks`` (the same ValueError, for the first bad one)."""
        axis, delta, ring = self._peer_offset(key)
        ranks = np.asarray(ranks, dtype=np.int64)
        here = self.coord_array(ranks, axis)
        coords = here + delta
        if ring:
            coords %= self.degrees[axis]
        else:
            bad = (coords < 0) | (coords >= self.degrees[axis])
            if bad.any():
                raise ValueError(f"rank {int(ranks[bad.argmax()])} has no {axis} neighbour at offset {delta}")
        return ranks + (coords - here) * self.strides[axis]

    @staticmethod
    def _peer_offset(key: str) -> tuple[str, int, bool]:
        """(axis, offset, around the axis as a ring) of a peer key."""
        for sign in ("+", "-"):
            if sign in key:
                axis, n = key.split(sign, 1)
                return axis.rstrip("%"), int(n) * (1 if sign == "+" else -1), axis.endswith("%")
        raise ValueError(f"peer key {key!r} must look like 'pp+1' or 'pp-1'")


class GroupTable:
    """Names (pg_name) of the groups of the keys in use, and their members."""

    def __init__(self, mesh: Mesh, keys: Iterable[str]):
        self.mesh = mesh
        order = {a: i for i, a in enumerate(RANK_AXES)}
        self.keys: list[str] = sorted(
            set(keys), key=lambda k: (len(k.split("+")), [order[a.partition("@")[0]] for a in k.split("+")], k))
        self.offset: dict[str, int] = {}
        total = 0
        for k in self.keys:
            self.offset[k] = total
            total += mesh.num_groups(k)
        self.count = total

    def name(self, rank: int, key: str) -> str:
        return str(1 + self.offset[key] + self.mesh.group_index(key, rank))

    def ids(self, key: str, ranks: np.ndarray) -> np.ndarray:
        """The pg_name, as an integer, of ``key``'s group of every rank in ``ranks``."""
        return 1 + self.offset[key] + self.mesh.group_index_array(key, ranks)

    @cached_property
    def groups(self) -> dict[str, list[int]]:
        """pg_name -> member ranks, for every group of every key in use (ids ascending)."""
        out: dict[str, list[int]] = {}
        for k in self.keys:
            first = 1 + self.offset[k]
            for g, members in enumerate(self.mesh.all_group_members(k).tolist()):
                out[str(first + g)] = members
        return out

