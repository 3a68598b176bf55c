"""What the host checks of plugins' output before it lowers anything.

* a model's graph (:func:`check_model_graph`): a Graph with a loss, ops in an order where
  every tensor is made before it is read, no cycle, and every op a kernel the core or
  the model's registered kernels (``ModelSpec.kernels``) know;
* a strategy's declarations (:func:`check_declarations`): placements only on axes the
  mesh has, on dims the tensors have, the degree table untouched;
* a schedule's order (:func:`checked_order`): the structure of
  :func:`stage_core.schedule.steps.order_problem`.

Each refusal is a :class:`~stage_core.guard.PluginFault` naming the plugin and the record.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping

import networkx as nx

from .errors import UsageError
from .guard import Owner, PluginFault, fault
from .ir.graph import Graph
from .ir.ops import Op
from .parallel.placement import FLAT, Partial, Replicate, Shard, ShardedGraph, dim_position
from .schedule.steps import PLACEMENTS, copies, is_pair, order_problem


# --------------------------------------------------------------------------- models


def known_kernel(graph: Graph, op: Op) -> bool:
    """Whether the core (or the graph's registered kernels) can differentiate and lower ``op``."""
    from .autodiff import RULES

    if op.kind == "view":
        return True
    if op.attrs.get("registered") is not None:
        return op.attrs["registered"] in graph.registered
    return (op.kind, op.fn) in RULES or (op.kind, "") in RULES


def check_model_graph(graph: Any, owner: Owner) -> Graph:
    """``graph`` as a model's build returned it, or a PluginFault saying what is wrong."""
    if not isinstance(graph, Graph):
        raise fault(owner, f"build returned a {type(graph).__name__}, not a Graph (GraphBuilder.finish gives one)")
    if not graph.ops:
        raise fault(owner, f"build returned graph {graph.name!r} with no ops")
    if graph.loss is None:
        raise fault(owner, f"graph {graph.name!r} has no loss (end the model with GraphBuilder.finish(loss))")
    try:
        graph.check_order()
    except ValueError as exc:
        raise fault(owner, f"graph {graph.name!r}: {exc}") from None
    producers = graph.producers()
    if graph.loss not in producers:
        raise fault(owner, f"graph {graph.name!r}: the loss {graph.loss.name} is not made by any op")
    if not nx.is_directed_acyclic_graph(graph.to_networkx()):
        cycle = nx.find_cycle(graph.to_networkx())
        names = " -> ".join(graph.ops[i].name for i, _ in cycle[:4])
        raise fault(owner, f"graph {graph.name!r} has a cycle: {names}")
    for op in graph.ops:
        if not known_kernel(graph, op):
            name = op.attrs.get("registered") or f"{op.kind}/{op.fn}" if op.fn else op.kind
            raise fault(owner, f"graph {graph.name!r}: op {op.name} is kernel {name!r}, which neither the core "
                               f"nor the model's registered kernels (ModelSpec.kernels) know")
    return graph


# --------------------------------------------------------------------------- strategies


class Degrees(dict):
    """The plan's degree per mesh axis: the host's; a strategy reads it and cannot write it.
    ``parts``: the axes strategies carve out of others (:func:`axis_parts`), whose degrees it
    holds too."""

    def __init__(self, degrees: Mapping[str, int] = (), parts: Mapping[str, tuple[str, int, str]] | None = None):
        table = dict(degrees)
        for parent, (inner, n, outer) in (parts or {}).items():
            table[inner], table[outer] = n, table[parent] // n
        super().__init__(table)
        self.parts = dict(parts or {})

    def _refuse(self, *args, **kwargs):
        raise TypeError(f"the degree table is the host's (the plan's degrees); a strategy cannot change it "
                        f"(it tried to set {args[0]!r})" if args else "the degree table is the host's")

    __setitem__ = _refuse
    __delitem__ = _refuse
    update = _refuse
    setdefault = _refuse
    pop = _refuse
    popitem = _refuse
    clear = _refuse


def _check_layout(layout: Any, tensor, axes: set[str], owner: Owner, what: str) -> None:
    if not isinstance(layout, Mapping):
        raise fault(owner, f"{what} of {tensor.name} is a {type(layout).__name__}, not a mapping of axis to "
                           f"placement")
    for axis, placement in layout.items():
        if axis not in axes:
            raise fault(owner, f"{what} of {tensor.name} names mesh axis {axis!r}, which the mesh does not have "
                               f"(axes: {', '.join(sorted(axes))}); declare a new axis with AxisSpec")
        if not isinstance(placement, (Shard, Replicate, Partial)):
            raise fault(owner, f"{what} of {tensor.name} on {axis} is {placement!r}, not Shard, Replicate or "
                               f"Partial")
        if isinstance(placement, Shard) and placement.dim != FLAT and dim_position(tensor, placement.dim) is None:
            dims = ", ".join(str(getattr(d, "name", d)) for d in tensor.shape)
            raise fault(owner, f"{what} of {tensor.name} shards dim {placement.dim!r} on {axis}, which the tensor "
                               f"[{dims}] does not have")


#: the axes an AxisSpec may be carved out of, and the names it may not take
SPLITTABLE = ("tp", "cp", "dp", "pp")
TAKEN = ("tp", "cp", "dp", "pp", "ep", "etp", "edp")
_AXIS_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def axis_parts(strategies: Iterable[Any], plan: Any, owner_of: Callable[[Any], Owner]) -> dict[str, tuple[str, int, str]]:
    """The axes the strategies declare (``StrategySpec.axes``) that the plan turns on, as
    ``{parent: (name, degree, rest)}``: the degree is the strategy option the AxisSpec names
    (1, or not given: the axis is off).  A declaration that cannot be an axis is the
    strategy's fault (``owner_of(strategy)``); a degree that does not divide its parent's,
    or two axes splitting one, the user's (UsageError)."""
    from .records import AxisSpec

    out: dict[str, tuple[str, int, str]] = {}
    by: dict[str, str] = {}
    names: dict[str, Any] = {}
    degrees = plan.degrees()
    for strategy in strategies:
        options = {o.name: o for o in strategy.options}
        for spec in strategy.axes:
            owner = owner_of(strategy)
            if not isinstance(spec, AxisSpec):
                raise fault(owner, f"axes holds a {type(spec).__name__}, not an AxisSpec")
            if spec.within not in SPLITTABLE:
                raise fault(owner, f"axis {spec.name!r} is carved out of {spec.within!r}, which is not an axis of "
                                   f"the ranks (one of {', '.join(SPLITTABLE)})")
            for name in (spec.name, spec.rest_name):
                if not isinstance(name, str) or not _AXIS_NAME.match(name):
                    raise fault(owner, f"axis name {name!r}: lower-case letters, digits and '_', a letter first")
                if name in TAKEN or name in names:
                    other = "the mesh's own axes" if name in TAKEN else f"strategy {names[name].name!r}"
                    raise fault(owner, f"axis name {name!r} is taken (by {other}); give the AxisSpec another name "
                                       f"(or rest)")
                names[name] = strategy
            opt = options.get(spec.option)
            if opt is None or opt.type is not int:
                raise fault(owner, f"axis {spec.name!r} takes its degree from option {spec.option!r}, which the "
                                   f"strategy does not declare as an int OptionSpec")
            n = plan.option(spec.option, opt.default if opt.default is not None else 1)
            if n == 1:
                continue
            parent = degrees[spec.within]
            if not isinstance(n, int) or isinstance(n, bool) or n < 1 or parent % n:
                valid = ", ".join(str(d) for d in range(1, parent + 1) if parent % d == 0)
                raise UsageError(f"--{spec.option} {n}: the {spec.name} axis is carved out of {spec.within} "
                                 f"(--{spec.within} {parent}); it must divide {parent} (valid: {valid})")
            if spec.within in by:
                raise UsageError(f"--{spec.option} {n} and --{by[spec.within]} both split {spec.within}; give one")
            by[spec.within] = spec.option
            out[spec.within] = (spec.name, n, spec.rest_name)
    return out


def check_declarations(sg: Any, before: ShardedGraph, axes: Iterable[str], owner: Owner) -> ShardedGraph:
    """The ShardedGraph a strategy's ``apply`` returned, checked against the mesh's ``axes``."""
    if sg is None:
        return before
    if not isinstance(sg, ShardedGraph):
        raise fault(owner, f"apply returned a {type(sg).__name__}, not the ShardedGraph it was given")
    if sg.graph is not before.graph:
        raise fault(owner, "apply returned a ShardedGraph of another graph; declare placements on the one given")
    axes = set(axes)
    if dict(sg.degrees) != dict(before.degrees) or not isinstance(sg.degrees, Degrees):
        raise fault(owner, "apply changed the degree table; degrees are the plan's (the host's)")
    for what, table in (("compute placement", sg.param_compute), ("storage placement", sg.param_storage),
                        ("input placement", sg.input_layout)):
        for tensor, layout in table.items():
            _check_layout(layout, tensor, axes, owner, what)
    for what, group in (("gradient target", sg.grad_target), ("gradient shards", sg.grad_storage_sharded),
                        ("optimizer shards", sg.optimizer_sharded), ("preferred dims", sg.prefer),
                        ("forward reuse", sg.reuse_forward), ("rings", sg.rings),
                        ("pipeline split", (sg.pipeline_split,) if sg.pipeline_split else ())):
        for axis in group:
            if axis not in axes:
                raise fault(owner, f"{what} on mesh axis {axis!r}, which the mesh does not have "
                                   f"(axes: {', '.join(sorted(axes))})")
    for tag, hints in sg.tag_hints.items():
        for axis in hints:
            if axis not in axes:
                raise fault(owner, f"placement hint for tag {tag!r} on mesh axis {axis!r}, which the mesh does "
                                   f"not have (axes: {', '.join(sorted(axes))})")
    dims = set(sg.graph.dims) | {"b", "s"}
    for axis, blocks in sg.prefer.items():
        for block, names in blocks.items():
            unknown = [n for n in names if n not in dims and not _is_dim_name(sg.graph, n)]
            if unknown:
                raise fault(owner, f"preferred dims on {axis} name {unknown[0]!r}, which graph "
                                   f"{sg.graph.name!r} has no dim of")
    return sg


def _is_dim_name(graph: Graph, name: str) -> bool:
    return any(getattr(d, "name", None) == name for t in graph.params + graph.inputs for d in t.shape)


# --------------------------------------------------------------------------- schedules


class CheckedOrder:
    """A schedule's ``order(stages, micro_batches, chunks, **options)``, each result checked
    (a PluginFault names the schedule and the first problem); ``placement`` is the
    schedule's, ``options`` the values of its options (keyword arguments by ``dest``).
    Called with the plan's virtual stages: the order gets that many chunks a stage, times
    the placement's copies (DualPipe's ``"dual"``: 2 for one virtual stage)."""

    def __init__(self, order: Callable, owner: Owner, placement: str = "loop",
                 options: Mapping[str, Any] | None = None):
        self.order, self.owner, self.placement = order, owner, placement
        self.options = dict(options or {})

    def __call__(self, stages: int, micro_batches: int, virtual: int = 1):
        chunks = virtual * copies(self.placement)
        got = self.order(stages, micro_batches, chunks, **self.options)
        problem = order_problem(got, stages, micro_batches, chunks, self.placement)
        if problem is not None:
            what = (f"{virtual} virtual stage{'s' if virtual != 1 else ''}" if chunks == virtual
                    else f"{chunks} chunks a stage (placement {self.placement!r})")
            raise PluginFault(f"{self.owner}: its order for pp {stages}, {micro_batches} micro-batches, {what}: "
                              f"{problem}")
        return [[tuple(map(tuple, step)) if is_pair(step) else tuple(step) for step in steps] for steps in got]


def checked_order(spec, owner: Owner, options: Mapping[str, Any] | None = None) -> CheckedOrder:
    """The order of schedule ``spec`` with its ``options`` bound, checked, after checking the
    spec's own declarations."""
    if spec.placement not in PLACEMENTS:
        raise fault(owner, f"placement {spec.placement!r}; known: {', '.join(PLACEMENTS)}")
    if spec.chunks is not None and (not isinstance(spec.chunks, int) or spec.chunks < 1):
        raise fault(owner, f"chunks {spec.chunks!r}: a positive number of chunks per stage, or None")
    if spec.placement == "dual" and spec.chunks != 2:
        raise fault(owner, f"chunks {spec.chunks!r} with placement 'dual': a stage runs 2 chunks, the two copies "
                           f"(the model cut into as many chunks as stages); declare chunks=2")
    return CheckedOrder(spec.order, owner, spec.placement, options)
