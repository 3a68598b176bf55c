"""Typed, frozen registration records that plugins hand to the host.

Each record has a ``name`` that is unique within its kind; the host fills in
``plugin`` (the name of the plugin that registered it) so listings and clash
errors can say where a record came from.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from .ir.graph import Graph
    from .trace import TraceJob, TraceSet


@dataclass(frozen=True)
class ModelSpec:
    """A model family and its named presets.

    ``build(config)`` returns the single-device forward graph of ``config``.
    ``presets`` maps a preset name (``"gpt3-175b"``) to a config object.
    ``from_dict(d)`` rebuilds a config of this family from a plain dict (the
    inverse of the config's ``to_dict()``), used for ``--set`` overrides and for
    manifests.  ``hf_model_types`` lists the Hugging Face ``model_type`` values this
    family imports.
    """

    name: str
    family: str
    build: Callable[[Any], "Graph"]
    presets: Mapping[str, Any]
    from_dict: Callable[[Mapping[str, Any]], Any]
    hf_model_types: tuple[str, ...] = ()
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class StrategySpec:
    """A parallel strategy.

    ``axis`` is the mesh axis it drives (``"dp"``, ``"tp"``...) or ``None`` for
    strategies that change how the graph is run rather than how it is split
    (recompute).  ``validate(model, plan)`` returns a list of error strings (empty
    when the plan is valid for the model).  ``apply(graph, mesh, plan)`` returns
    the graph annotated with this strategy's placements.
    """

    name: str
    axis: str | None
    validate: Callable[[Any, Any], Sequence[str]]
    apply: Callable[[Any, Any, Any], Any]
    order: int = 100  # application order; lower first
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class ScheduleSpec:
    """A pipeline schedule.

    ``order(stages, micro_batches, virtual)`` returns, for each pipeline rank, the
    list of steps it runs in order; a step is ``(kind, micro_batch, chunk)`` with
    kind ``"F"`` or ``"B"``.
    """

    name: str
    order: Callable[[int, int, int], Sequence[Sequence[tuple[str, int, int]]]]
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class BackendSpec:
    """A trace backend (output format).

    ``write(job, out_dir)`` writes one file per rank into ``out_dir`` (the host
    writes ``comm_groups.json`` and ``manifest.json``).  ``read(dir)`` decodes a
    set this backend wrote, for ``stage validate``; ``detect(dir)`` says whether a
    directory holds this backend's files.
    """

    name: str
    write: Callable[["TraceJob", Path], None]
    read: Callable[[Path], "TraceSet"] | None = None
    detect: Callable[[Path], bool] | None = None
    format_id: str = ""
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class CommandSpec:
    """A ``stage`` subcommand contributed by a plugin.

    ``configure(parser)`` adds arguments to the subcommand's parser; ``run(args)``
    does the work and returns the process exit status.
    """

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    plugin: str = ""


@dataclass(frozen=True)
class ExecutorSpec:
    """A way to run many independent units of work (the points of a sweep).

    ``run(fn, items, options)`` calls ``fn(item)`` for every item and yields
    ``(index, result)`` pairs as results arrive, in any order.  ``fn`` is a
    module-level function and items and results are plain picklable data (dicts of
    numbers and strings), so an executor may ship them to other processes or
    machines.  ``options`` carries the user's executor settings (``workers``,
    ``address``...); an executor ignores the ones it does not know.
    """

    name: str
    run: Callable[[Callable[[Any], Any], Sequence[Any], Mapping[str, Any]], Iterator[tuple[int, Any]]]
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class PlanSpec:
    """A named parallel plan, usually a published one: the model and the flags that give it.

    ``settings`` maps ``stage generate``/``report`` flag names without their dashes
    (``"tp"``, ``"stage-layers"``, ``"global-batch"``, ``"model"``) to values; ``True``
    and ``False`` turn a switch on or off (``--sp`` / ``--no-sp``), a list repeats the
    flag (``"set": ["layers=4"]``).  ``--plan NAME`` applies them; flags given on the
    command line override them.  ``source`` says where the plan is published.
    """

    name: str
    settings: Mapping[str, Any]
    description: str = ""
    source: str = ""
    plugin: str = ""

    def flags(self) -> list[str]:
        """``settings`` as command-line arguments."""
        out: list[str] = []
        for key, value in self.settings.items():
            if value is True:
                out.append(f"--{key}")
            elif value is False:
                out.append(f"--no-{key}")
            elif isinstance(value, (list, tuple)):
                for item in value:
                    out += [f"--{key}", str(item)]
            else:
                out += [f"--{key}", str(value)]
        return out

    @property
    def world_size(self) -> int:
        n = 1
        for axis in ("tp", "cp", "dp", "pp"):
            n *= int(self.settings.get(axis, 1))
        return n


@dataclass(frozen=True)
class PluginInfo:
    """What ``stage plugins`` reports about one plugin."""

    name: str
    source: str  # "builtin", "entrypoint" or "registered"
    version: str = ""
    provides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    error: str = ""
