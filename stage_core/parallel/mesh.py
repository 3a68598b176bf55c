"""The device mesh: named axes, Megatron's rank order, process groups with stable ids.

The order string lists axes fastest-varying first (``"tp-cp-ep-dp-pp"``): rank r's
coordinate on the i-th axis is ``(r // stride_i) % degree_i`` with strides growing
along the string.  ep is not a factor of the world size (it is carved out of
dp×cp), so it takes no place in these coordinates.

Expert layers see the same ranks through a second view, as Megatron-Core's expert
``RankGenerator`` does: the same order string with cp left out, tp read as the
expert tensor-parallel degree ``etp`` and dp as the expert data-parallel degree
``edp`` = tp·cp·dp / (etp·ep), so the axes ``etp``, ``ep``, ``edp`` and ``pp`` factor
the world again.  A key names axes of one view only.

A strategy may carve an axis of its own out of one of these (``AxisSpec``: hybrid
sharding's shard group inside dp): ``parts = {"dp": ("dps", 8, "dpr")}`` splits dp into
``dps``, its fastest 8 ranks, and ``dpr``, the rest (dp / 8, one rank of each block).
The decoder view then counts in those parts (its *atoms*): a key naming ``dp`` spans
``dps`` and ``dpr``; ``dp`` keeps its own coordinate and degree.

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
from itertools import combinations
from typing import Iterable, Mapping, Sequence

import numpy as np

from .plan import AXES, Plan

RANK_AXES = tuple(a for a in AXES if a != "ep")
EXPERT_AXES = ("etp", "ep", "edp")
_KEY_ORDER = RANK_AXES + EXPERT_AXES


def canonical_key(axes: Iterable[str], order: Sequence[str] = _KEY_ORDER) -> str:
    """``axes`` joined in the mesh's key order (a mesh with axes of strategies' own:
    :attr:`Mesh.key_order`)."""
    axes = set(axes)
    unknown = axes - set(order)
    if unknown:
        raise ValueError(f"unknown mesh axes {sorted(unknown)}; known: {tuple(order)}")
    return "+".join(a for a in order if a in axes)


class _View:
    """One factorisation of the ranks: axes in order (fastest first), degrees, strides."""

    def __init__(self, order: list[str], degrees: dict[str, int]):
        self.order = order
        self.degrees = degrees
        self.strides: dict[str, int] = {}
        stride = 1
        for a in order:
            self.strides[a] = stride
            stride *= degrees[a]
        self.size = stride


class Mesh:
    def __init__(self, degrees: Mapping[str, int], order: str = "tp-cp-ep-dp-pp", *,
                 expert: Mapping[str, int] | None = None,
                 parts: Mapping[str, tuple[str, int, str]] | None = None):
        """``degrees`` of tp, cp, dp, pp; ``expert``: ``{"ep": .., "etp": ..}`` (default ep 1, etp = tp);
        ``parts``: axes carved out of one of them, ``{parent: (inner, inner degree, outer)}``."""
        self.degrees = {a: int(degrees.get(a, 1)) for a in RANK_AXES}
        names = order.split("-")
        self.order = [a for a in names if a != "ep"]
        self.parts = dict(parts or {})
        atoms: list[str] = []
        atom_degrees = dict(self.degrees)
        self.atoms: dict[str, tuple[str, ...]] = {}
        for a in self.order:
            split = self.parts.get(a)
            if split is None:
                atoms.append(a)
                continue
            inner, n, outer = split
            if n < 1 or self.degrees[a] % n:
                raise ValueError(f"{inner} degree {n} does not divide {a} degree {self.degrees[a]}")
            atoms += [inner, outer]
            atom_degrees.update({inner: n, outer: self.degrees[a] // n})
            self.atoms[a] = (inner, outer)
        self.decoder = _View(atoms, atom_degrees)
        self.strides = dict(self.decoder.strides)
        for a, (inner, outer) in self.atoms.items():  # the parent keeps its own coordinate
            self.strides[a] = self.strides[inner]
        self.world_size = self.decoder.size
        #: the order keys name axes in: the decoder axes, each part after its parent, then the expert view's
        self.key_order: tuple[str, ...] = tuple(
            x for a in RANK_AXES for x in (a, *self.atoms.get(a, ()))) + EXPERT_AXES
        expert = dict(expert or {})
        ep = int(expert.get("ep", 1))
        etp = int(expert.get("etp") or self.degrees["tp"])
        inner = self.degrees["tp"] * self.degrees["cp"] * self.degrees["dp"]
        if inner % (etp * ep):
            raise ValueError(f"etp {etp} x ep {ep} does not divide tp x cp x dp = {inner}")
        rename = {"tp": "etp", "dp": "edp"}
        expert_order = [rename.get(a, a) for a in names if a != "cp"]
        self.expert = _View(expert_order, {"etp": etp, "ep": ep, "edp": inner // (etp * ep),
                                           "pp": self.degrees["pp"]})
        self.degrees.update({a: self.expert.degrees[a] for a in EXPERT_AXES})
        self.degrees.update({a: atom_degrees[a] for split in self.atoms.values() for a in split})

    @classmethod
    def from_plan(cls, plan: Plan, parts: Mapping[str, tuple[str, int, str]] | None = None) -> "Mesh":
        return cls({a: plan.degree(a) for a in RANK_AXES}, plan.order, expert={"ep": plan.ep, "etp": plan.expert_tp},
                   parts=parts)

    def key(self, axes: Iterable[str]) -> str:
        """The key of a group along ``axes``, in :attr:`key_order`."""
        return canonical_key(axes, self.key_order)

    def expand(self, axes: Iterable[str]) -> list[str]:
        """``axes`` with each split axis as its parts (the decoder view's atoms)."""
        return [x for a in axes for x in self.atoms.get(a, (a,))]

    @property
    def expert_stages_match(self) -> bool:
        """The expert view has the same pipeline groups (Megatron-Core asserts it: with pp
        before dp in the order, edp must equal dp)."""
        return self.expert.strides["pp"] == self.strides["pp"]

    # ------------------------------------------------------------------ views
    def view(self, key: str) -> _View:
        axes = set(self.key_axes(key))
        if axes & set(EXPERT_AXES):
            if not axes <= set(self.expert.order):
                raise ValueError(f"group key {key!r} mixes expert axes with {sorted(axes - set(self.expert.order))}")
            return self.expert
        return self.decoder

    def signature(self, key: str) -> tuple:
        """The (stride, size) runs a key spans: two keys with equal signatures have the same groups."""
        if "@" in key:
            return ("restricted", key)
        view = self.view(key)
        runs = sorted((view.strides[a], view.degrees[a]) for a in self.key_axes(key, atoms=True)
                      if view.degrees[a] > 1)
        merged: list[list[int]] = []
        for stride, size in runs:
            if merged and merged[-1][0] * merged[-1][1] == stride:
                merged[-1][1] *= size
            else:
                merged.append([stride, size])
        return tuple(map(tuple, merged))

    def canonical(self, key: str) -> str:
        """``key``, or the decoder-view key with the same groups (an expert axis that
        coincides with tp, cp, dp or a combination names no new groups, nor a part of a
        split axis that is all of it)."""
        if self.view(key) is self.decoder and not set(self.key_axes(key)) - set(RANK_AXES):
            return key
        if "@" in key:
            return key
        sig = self.signature(key)
        axes = [a for a in RANK_AXES if a != "pp" or "pp" in self.key_axes(key)]
        for n in range(1, len(axes) + 1):
            for combo in combinations(axes, n):
                if self.signature("+".join(combo)) == sig and all(self.degrees[a] > 1 for a in combo):
                    return canonical_key(combo)
        return key

    # ------------------------------------------------------------------ coordinates
    def coord(self, rank: int, axis: str) -> int:
        if axis in EXPERT_AXES:
            return (rank // self.expert.strides[axis]) % self.expert.degrees[axis]
        return (rank // self.strides[axis]) % self.degrees[axis]

    def coords(self, rank: int) -> dict[str, int]:
        return {a: self.coord(rank, a) for a in self.order}

    def expert_coords(self, rank: int) -> dict[str, int]:
        return {a: self.coord(rank, a) for a in self.expert.order}

    def rank(self, coords: Mapping[str, int]) -> int:
        return sum(coords.get(a, 0) * self.strides[a] for a in self.order)

    def coord_array(self, ranks: np.ndarray, axis: str) -> np.ndarray:
        if axis in EXPERT_AXES:
            return (np.asarray(ranks, dtype=np.int64) // self.expert.strides[axis]) % self.expert.degrees[axis]
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

    def key_axes(self, key: str, atoms: bool = False) -> list[str]:
        """The axes ``key`` names; ``atoms``: with each split axis as its parts."""
        axes = [axis for axis, _ in self._parts(key)]
        return self.expand(axes) if atoms else axes

    def _key_parts(self, key: str) -> dict[str, tuple[int, ...] | None]:
        """{atom: its coordinates in the key (None: all)}; a restricted axis is never split."""
        out: dict[str, tuple[int, ...] | None] = {}
        for axis, coords in self._parts(key):
            for atom in self.atoms.get(axis, (axis,)):
                out[atom] = coords
        return out

    def group_size(self, key: str) -> int:
        view = self.view(key)
        n = 1
        for axis, coords in self._key_parts(key).items():
            n *= len(coords) if coords is not None else view.degrees[axis]
        return n

    def num_groups(self, key: str) -> int:
        view = self.view(key)
        n = 1
        inside = set(self.key_axes(key, atoms=True))
        for a in view.order:
            if a not in inside:
                n *= view.degrees[a]
        return n

    def group_index(self, key: str, rank: int) -> int:
        """Index of rank's group among the groups of ``key`` (mixed radix over the other axes)."""
        view = self.view(key)
        inside = set(self.key_axes(key, atoms=True))
        index, radix = 0, 1
        for a in view.order:
            if a in inside:
                continue
            index += (rank // view.strides[a]) % view.degrees[a] * radix
            radix *= view.degrees[a]
        return index

    def group_index_array(self, key: str, ranks: np.ndarray) -> np.ndarray:
        """:meth:`group_index` of every rank in ``ranks``."""
        view = self.view(key)
        inside = set(self.key_axes(key, atoms=True))
        ranks = np.asarray(ranks, dtype=np.int64)
        index, radix = np.zeros(ranks.shape, dtype=np.int64), 1
        for a in view.order:
            if a in inside:
                continue
            index += (ranks // view.strides[a]) % view.degrees[a] * radix
            radix *= view.degrees[a]
        return index

    def all_group_members(self, key: str) -> np.ndarray:
        """Members of every group of ``key``: row ``g`` holds group ``g``'s ranks, ascending."""
        view = self.view(key)
        parts = self._key_parts(key)
        base = np.zeros(1, dtype=np.int64)  # first rank of each group, in group_index order
        for a in view.order:
            if a not in parts:
                base = (base[None, :] + view.strides[a] * np.arange(view.degrees[a])[:, None]).ravel()
        offsets = np.zeros(1, dtype=np.int64)
        for a in view.order:
            if a in parts:
                coords = parts[a] if parts[a] is not None else range(view.degrees[a])
                offsets = (offsets[None, :] + view.strides[a] * np.asarray(coords)[:, None]).ravel()
        return base[:, None] + np.sort(offsets)[None, :]

    def group_members(self, key: str, rank: int) -> list[int]:
        view = self.view(key)
        parts = self._key_parts(key)
        inside = [a for a in view.order if a in parts]
        base = rank - sum((rank // view.strides[a]) % view.degrees[a] * view.strides[a] for a in inside)
        members = [base]
        for a in inside:
            coords = parts[a] if parts[a] is not None else range(view.degrees[a])
            members = [m + i * view.strides[a] for i in coords for m in members]
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
        order = {a: i for i, a in enumerate(mesh.key_order)}
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

