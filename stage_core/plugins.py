"""The plugin host: discovery, registries, and clear errors.

Plugins arrive three ways: built-in modules registered by module name, third
parties through the entry-point group ``stage``, and objects registered directly
(tests).  ``STAGE_DISABLE_PLUGINS`` (comma-separated names) blocks plugins.  A
plugin that fails to import is recorded with its error and skipped, so commands
that do not need it keep working; :meth:`PluginHost.broken` names it when
something it might have provided is missing.

The rest of the code calls hooks only through the typed methods here, which
attribute every record to the plugin that registered it, reject duplicate names
(naming both plugins) and return records sorted by name.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from importlib import metadata
from typing import Any, Iterable, Mapping, Sequence

import pluggy

from . import hookspecs
from .errors import PluginError, UsageError
from .guard import Guarded, Owner, PluginFault, guard_record
from .hookspecs import PROJECT
from .models import read_hf
from .records import (BackendSpec, CommandSpec, ComputeModelSpec, EstimatorSpec, ExecutorSpec, HardwareSpec, ModelSpec,
                      OptionSpec, PlanSpec, PluginInfo, ScheduleSpec, SimulatorSpec, StrategySpec)

#: the record type each registration hook returns
RECORD_TYPES = {
    "stage_models": ModelSpec, "stage_strategies": StrategySpec, "stage_schedules": ScheduleSpec,
    "stage_trace_backends": BackendSpec, "stage_commands": CommandSpec, "stage_executors": ExecutorSpec,
    "stage_plans": PlanSpec, "stage_hardware": HardwareSpec, "stage_compute_models": ComputeModelSpec,
    "stage_simulators": SimulatorSpec, "stage_estimators": EstimatorSpec,
}

#: modules of the core that are plugins themselves
BUILTINS: tuple[str, ...] = ("stage_core.schedule.builtin",)
ENTRY_POINT_GROUP = "stage"
DISABLE_ENV = "STAGE_DISABLE_PLUGINS"


def disabled_from_env(env: Mapping[str, str] | None = None) -> set[str]:
    raw = (env if env is not None else os.environ).get(DISABLE_ENV, "")
    return {name.strip() for name in raw.split(",") if name.strip()}


class PluginHost:
    def __init__(self, *, autoload: bool = True, builtins: Iterable[str] = BUILTINS,
                 disabled: Iterable[str] | None = None):
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.disabled = set(disabled_from_env() if disabled is None else disabled)
        self.sources: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        self.dists: dict[str, str] = {}  # plugin name -> its distribution
        self.errors: dict[str, str] = {}
        self._collected: dict[str, list] = {}
        for name in self.disabled:
            self.pm.set_blocked(name)
        for modname in builtins:
            self._register_module(modname, modname, "builtin")
        if autoload:
            self._load_entry_points()
        self.check()

    # ------------------------------------------------------------------ loading
    def _register_module(self, name: str, modname: str, source: str) -> None:
        if name in self.disabled:
            return
        try:
            module = importlib.import_module(modname)
        except Exception as exc:  # a broken plugin must not break the host
            self.errors[name] = f"{type(exc).__name__}: {exc}"
            return
        self.register(module, name, source)

    def _load_entry_points(self) -> None:
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if ep.name in self.disabled or self.pm.has_plugin(ep.name):
                continue
            try:
                module = ep.load()
            except Exception as exc:
                self.errors[ep.name] = f"{type(exc).__name__}: {exc}"
                continue
            version = ""
            if ep.dist is not None:
                version = ep.dist.version
                self.dists[ep.name] = ep.dist.name
            self.register(module, ep.name, "entrypoint", version)

    def register(self, plugin: Any, name: str, source: str = "registered", version: str = "") -> None:
        """Register a plugin object (module or instance) under ``name``."""
        if name in self.disabled:
            return
        if self.pm.has_plugin(name):
            raise PluginError(f"two plugins are named {name!r}; rename one of them")
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r} is invalid: {exc}") from None
        self.sources[name] = source
        self.versions[name] = version
        self._collected.clear()

    def check(self) -> None:
        """A hook implementation without a matching spec (a misspelling) is an error."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"{exc}") from None

    # ------------------------------------------------------------------ collecting
    def owner(self, plugin: str, kind: str = "", name: str = "") -> Owner:
        """Who ``plugin``'s record ``name`` (a ``kind``) is, as refusals name it."""
        dist = self.dists.get(plugin, "")
        version = self.versions.get(plugin, "")
        return Owner(plugin, f"{dist} {version}".strip() if dist else "", kind, name)

    def _collect(self, hook_name: str, kind: str) -> list:
        """Every plugin's records of one hook: checked, attributed, guarded, sorted.

        Hooks are called once per host (records are frozen), so a plugin's hook runs once."""
        got = self._collected.get(hook_name)
        if got is not None:
            return list(got)
        hook = getattr(self.pm.hook, hook_name)
        expected = RECORD_TYPES[hook_name]
        seen: dict[str, Any] = {}
        for impl in hook.get_hookimpls():
            owner = self.owner(impl.plugin_name)
            try:
                records = impl.function() or []
                records = list(records)
            except Exception as exc:
                raise PluginFault(f"{owner}: {hook_name} failed: {type(exc).__name__}: {exc}") from exc
            for record in records:
                if not isinstance(record, expected):
                    raise PluginFault(f"{owner}: {hook_name} returned a {type(record).__name__}, not a "
                                      f"{expected.__name__}")
                if not isinstance(record.name, str) or not record.name.strip():
                    raise PluginFault(f"{owner}: {hook_name} returned a {expected.__name__} with name "
                                      f"{record.name!r}; give it a name")
                record = dataclasses.replace(record, plugin=impl.plugin_name)
                record = guard_record(record, self.owner(impl.plugin_name, kind, record.name))
                other = seen.get(record.name)
                if other is not None:
                    raise PluginError(
                        f"{kind} name {record.name!r} is registered by two plugins: "
                        f"{other.plugin!r} and {record.plugin!r}; block one with {DISABLE_ENV}"
                    )
                seen[record.name] = record
        got = [seen[n] for n in sorted(seen)]
        self._collected[hook_name] = got
        return list(got)

    def models(self) -> list[ModelSpec]:
        specs = self._collect("stage_models", "model family")
        presets: dict[str, ModelSpec] = {}
        for spec in specs:
            for preset in spec.presets:
                other = presets.get(preset)
                if other is not None:
                    raise PluginError(
                        f"model preset {preset!r} is registered by two plugins: {other.plugin!r} and {spec.plugin!r}; "
                        f"block one with {DISABLE_ENV}"
                    )
                presets[preset] = spec
        return specs

    def strategies(self) -> list[StrategySpec]:
        return self._collect("stage_strategies", "strategy")

    def options(self) -> list[tuple[StrategySpec | ScheduleSpec, OptionSpec]]:
        """Every option a strategy or a schedule declares, with its record (strategies
        first); two records declaring one option name is an error naming both."""
        out: list = []
        seen: dict[str, Any] = {}
        for record in [*self.strategies(), *self.schedules()]:
            for opt in record.options:
                other = seen.get(opt.name)
                if other is not None:
                    raise PluginError(
                        f"option --{opt.name} is declared twice: by {other.name!r} (plugin {other.plugin!r}) and "
                        f"by {record.name!r} (plugin {record.plugin!r}); block one with {DISABLE_ENV}")
                seen[opt.name] = record
                out.append((record, opt))
        return out

    def schedules(self) -> list[ScheduleSpec]:
        return self._collect("stage_schedules", "schedule")

    def backends(self) -> list[BackendSpec]:
        return self._collect("stage_trace_backends", "trace backend")

    def commands(self) -> list[CommandSpec]:
        return self._collect("stage_commands", "command")

    def executors(self) -> list[ExecutorSpec]:
        return self._collect("stage_executors", "executor")

    def plans(self) -> list[PlanSpec]:
        return self._collect("stage_plans", "plan")

    def hardware(self) -> list[HardwareSpec]:
        return self._collect("stage_hardware", "hardware preset")

    def compute_models(self) -> list[ComputeModelSpec]:
        return self._collect("stage_compute_models", "compute model")

    def simulators(self) -> list[SimulatorSpec]:
        return self._collect("stage_simulators", "simulator")

    def estimators(self) -> list[EstimatorSpec]:
        return self._collect("stage_estimators", "estimator")

    #: the family ``config_from_hf`` reads a config.json as when none is given (``--family``)
    hf_family: str | None = None

    def hf_readers(self) -> dict[str, Any]:
        """family -> :class:`~stage_core.models.HFReader` of every family that reads config.json files."""
        return {s.family: s.hf_reader for s in self.models() if s.hf_reader is not None}

    def config_from_hf(self, hf_config: Mapping[str, Any], family: str | None = None, label: str = "config.json"):
        """The model config a parsed config.json describes.

        A plugin's own ``stage_config_from_hf`` answers first (unless a ``family`` is
        forced; pluggy's call order: tryfirst, then the last registered first, trylast last;
        a plugin that raises is named); otherwise the family whose keys the config has reads
        it (:func:`stage_core.models.read_hf`), or ``family`` (default :attr:`hf_family`).
        A config no family reads is a :class:`UsageError` naming the nearest family and
        the keys it could not place."""
        family = family if family is not None else self.hf_family
        if family is None:
            for impl in reversed(self.pm.hook.stage_config_from_hf.get_hookimpls()):
                owner = self.owner(impl.plugin_name, "config.json import", "stage_config_from_hf")
                found = Guarded(impl.function, owner, "the import")(hf_config=hf_config)
                if found is not None:
                    return found
        readers = self.hf_readers()
        if not readers and family is None:
            return None  # the caller names the supported model types (none)
        try:
            return read_hf(hf_config, readers, family, label)
        except UsageError as exc:
            raise UsageError(f"{exc}{self.broken_hint()}") from None

    # ------------------------------------------------------------------ lookups with clear errors
    def preset(self, name: str) -> tuple[ModelSpec, Any]:
        specs = self.models()
        for spec in specs:
            if name in spec.presets:
                return spec, spec.presets[name]
        known = sorted(p for s in specs for p in s.presets)
        hint = f"; known models: {', '.join(known)}" if known else "; no model plugin is installed"
        raise UsageError(f"--model {name}: unknown model{hint}{self.broken_hint()}")

    def family(self, family: str) -> ModelSpec:
        for spec in self.models():
            if spec.family == family or spec.name == family:
                return spec
        raise UsageError(f"no plugin provides model family {family!r}{self.broken_hint()}")

    def _named(self, records: Sequence[Any], name: str, flag: str, what: str, none: str, see: str = ""):
        """The record called ``name``, else a UsageError naming the flag and the known names."""
        for r in records:
            if r.name == name:
                return r
        known = ", ".join(r.name for r in records) or none
        raise UsageError(f"{flag} {name}: unknown {what}; known: {known}{see}{self.broken_hint()}")

    def backend(self, name: str) -> BackendSpec:
        return self._named(self.backends(), name, "--format", "trace format", "none installed")

    def executor(self, name: str, given: Mapping[str, Any] | None = None) -> ExecutorSpec:
        """The executor ``name``; ``given`` ({option: value}, None values left out) are the
        options the user set: one the executor declares it does not read is refused (an
        option that cannot do its job)."""
        e = self._named(self.executors(), name, "--executor", "executor", "none installed (install stage-search)")
        unread = [k for k, v in (given or {}).items() if v is not None and e.options is not None
                  and k not in e.options]
        if unread:
            reads = ", ".join(f"--{o}" for o in e.options) or "none"
            raise UsageError(f"--{unread[0]} {given[unread[0]]}: the {name} executor does not read it "
                             f"(it reads: {reads}); leave it out, or choose another --executor")
        return e

    def plan(self, name: str) -> PlanSpec:
        return self._named(self.plans(), name, "--plan", "plan", "none installed (install stage-parallel)",
                           " (see stage plans)")

    def hardware_preset(self, name: str, flag: str = "--gpu") -> HardwareSpec:
        return self._named(self.hardware(), name, flag, "hardware preset", "none installed (install stage-hardware)")

    def compute_model(self, name: str, gpu: str = "") -> ComputeModelSpec:
        models = self.compute_models()
        for m in models:
            if m.name == name:
                return m
        known = ", ".join(m.name for m in models) or "none installed (install stage-hardware)"
        whose = f"GPU {gpu} names " if gpu else ""
        raise UsageError(f"{whose}compute model {name!r}, which no installed plugin provides; "
                         f"known: {known}{self.broken_hint()}")

    def simulator(self, name: str, flag: str = "--simulator") -> SimulatorSpec:
        return self._named(self.simulators(), name, flag, "simulator",
                           "none installed (install stage-adapter-astrasim)")

    def estimator(self, name: str, flag: str = "--estimator") -> EstimatorSpec:
        return self._named(self.estimators(), name, flag, "estimator", "none installed (install stage-search)")

    def hf_model_types(self) -> list[str]:
        return sorted({t for s in self.models() for t in s.hf_model_types})

    def broken_hint(self) -> str:
        if not self.errors:
            return ""
        names = ", ".join(f"{n} ({e})" for n, e in sorted(self.errors.items()))
        return f" (plugins that failed to load: {names})"

    # ------------------------------------------------------------------ listing
    def info(self) -> list[PluginInfo]:
        provides: dict[str, dict[str, list[str]]] = {}

        def add(kind, records):
            for r in records:
                provides.setdefault(r.plugin, {}).setdefault(kind, []).append(r.name)

        add("models", [p for s in self.models() for p in
                       [dataclasses.replace(s, name=n) for n in sorted(s.presets)]])
        add("strategies", self.strategies())
        add("options", [dataclasses.replace(s, name=f"--{o.name}") for s, o in self.options()])
        add("schedules", self.schedules())
        add("trace_backends", self.backends())
        add("commands", self.commands())
        add("executors", self.executors())
        add("plans", self.plans())
        add("hardware", self.hardware())
        add("compute_models", self.compute_models())
        add("simulators", self.simulators())
        add("estimators", self.estimators())
        out = []
        for name, plugin in sorted(self.pm.list_name_plugin(), key=lambda x: x[0]):
            if plugin is None:  # a blocked name
                continue
            out.append(PluginInfo(name=name, source=self.sources.get(name, "registered"),
                                  version=self.versions.get(name, ""),
                                  provides={k: tuple(v) for k, v in sorted(provides.get(name, {}).items())}))
        for name, err in sorted(self.errors.items()):
            out.append(PluginInfo(name=name, source="entrypoint", error=err))
        for name in sorted(self.disabled):
            out.append(PluginInfo(name=name, source="blocked", error=f"blocked by {DISABLE_ENV}"))
        return out
