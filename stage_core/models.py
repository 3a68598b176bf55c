"""What model plugins share: a config base class and parameter counting.

A family's config is a frozen dataclass deriving from :class:`ModelConfig`.  Its
fields are plain values (ints, floats, bools, strings), so a config round-trips
through ``to_dict``/``from_dict`` (manifests, ``--set key=value``) and compares
by value.  ``build`` functions take a config and return the forward graph over
the dims ``b`` (micro-batch size) and ``s`` (sequence length), which the plan
binds later, and the model's own dims, bound from the config in ``graph.dims``.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping

from . import sym
from .errors import UsageError
from .ir.graph import Graph
from .ir.tensor import Role

#: dims every model graph uses and the plan (not the model) binds
PLAN_DIMS = ("b", "s")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Base of every family's config: ``name`` and ``family`` plus the family's fields."""

    name: str = ""
    family: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UsageError(
                f"unknown {cls.__name__} field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(names))}"
            )
        return cls(**dict(data))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def with_overrides(self, overrides: Mapping[str, str]):
        """Apply ``--set key=value`` strings, converting each to the field's type."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        hints = typing.get_type_hints(type(self))
        changes = {}
        for key, raw in overrides.items():
            if key not in fields:
                raise UsageError(
                    f"--set {key}={raw}: {type(self).__name__} has no field {key!r}; "
                    f"valid fields: {', '.join(sorted(fields))}"
                )
            changes[key] = _convert(key, raw, hints.get(key, str))
        return dataclasses.replace(self, **changes)


def _convert(key: str, raw: str, hint) -> Any:
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if raw.lower() in ("none", "null"):
            return None
        hint = args[0] if args else str
    try:
        if hint is bool:
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
    except ValueError:
        kind = {bool: "true or false", int: "an integer", float: "a number"}[hint]
        raise UsageError(f"--set {key}={raw}: expected {kind}") from None
    return raw


def param_counts(graph: Graph) -> tuple[int, int]:
    """(total, active) parameter counts of a model graph.

    Active counts what one token uses: a parameter tagged ``"expert"`` counts
    ``experts_per_token / experts`` of itself (``graph.meta``).
    """
    values = dict(graph.dims)
    for d in PLAN_DIMS:
        values.setdefault(d, 1)
    sizes = sym.Evaluator([p.numel for p in graph.params])(values)
    total = sum(sizes)
    k = graph.meta.get("experts_per_token")
    e = graph.meta.get("experts")
    active = 0
    for p, n in zip(graph.params, sizes):
        if "expert" in p.tags and k and e:
            active += n * k // e
        else:
            active += n
    return total, active


def parameters(graph: Graph):
    return [p for p in graph.params if p.role is Role.PARAMETER]
