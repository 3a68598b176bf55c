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
"""

from __future__ import annotations

from functools import cached_property
from typing import Iterable, Mapping

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
        """The rank a send/recv with peer key ``"<axis>+<n>"`` or ``"<axis>-<n>"`` talks to."""
        for sign in ("+", "-"):
            if sign in key:
                axis, n = key.split(sign, 1)
                delta = int(n) * (1 if sign == "+" else -1)
                break
        else:
            raise ValueError(f"peer key {key!r} must look like 'pp+1' or 'pp-1'")
        c = self.coord(rank, axis) + delta
        if not 0 <= c < self.degrees[axis]:
            raise ValueError(f"rank {rank} has no {axis} neighbour at offset {delta}")
        return rank + delta * self.strides[axis]


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

    @cached_property
    def groups(self) -> dict[str, list[int]]:
        """pg_name -> member ranks, for every group of every key in use."""
        out: dict[str, list[int]] = {}
        for k in self.keys:
            seen: set[int] = set()
            for r in range(self.mesh.world_size):
                g = self.mesh.group_index(k, r)
                if g in seen:
                    continue
                seen.add(g)
                out[str(1 + self.offset[k] + g)] = self.mesh.group_members(k, r)
        return dict(sorted(out.items(), key=lambda kv: int(kv[0])))

