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
    from .kernel import Kernel
    from .trace import TraceJob, TraceSet


@dataclass(frozen=True)
class ModelSpec:
    """A model family and its named presets.

    ``build(config)`` returns the single-device forward graph of ``config``.
    ``presets`` maps a preset name (``"gpt3-175b"``) to a config object.
    ``from_dict(d)`` rebuilds a config of this family from a plain dict (the
    inverse of the config's ``to_dict()``), used for ``--set`` overrides and for
    manifests.  ``hf_model_types`` lists the Hugging Face ``model_type`` values this
    family is known to import.  ``kernels`` lists the registered kernels
    (:class:`stage_core.kernels.KernelSpec`) the family's graphs call with
    ``GraphBuilder.kernel``: the registration is scoped to this family's models.
    ``hf_reader`` (a :class:`stage_core.models.HFReader`): how it reads a config.json by
    its keys; the host picks, for a config.json, the family whose keys it has
    (``hf_model_types`` default to the reader's ``model_types``).
    """

    name: str
    family: str
    build: Callable[[Any], "Graph"]
    presets: Mapping[str, Any]
    from_dict: Callable[[Mapping[str, Any]], Any]
    hf_model_types: tuple[str, ...] = ()
    description: str = ""
    kernels: tuple = ()
    plugin: str = ""
    hf_reader: Any = None

    def __post_init__(self):
        if self.hf_reader is not None and not self.hf_model_types:
            object.__setattr__(self, "hf_model_types", tuple(self.hf_reader.model_types))


_OPTION_TYPES = (int, float, str, bool)


@dataclass(frozen=True)
class OptionSpec:
    """An option of a strategy or a schedule: ``--<name>`` on every command that takes a plan.

    ``name`` is the flag without its dashes (``"shard-group"``), also its key in plan
    settings, in ``Plan.options`` and in the manifest's ``plan.options``.  ``type`` is
    ``int``, ``float``, ``str`` or ``bool`` (a switch: ``--name``/``--no-name``);
    ``choices`` limits the values.  The strategy reads the value with
    ``plan.option(name, default)``; a plan records only options given a value other
    than ``default``; a schedule's ``order`` gets it as a keyword argument.
    """

    name: str
    type: type = int
    default: Any = None
    help: str = ""
    choices: tuple = ()
    metavar: str = ""

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def add_to(self, parser: Any) -> None:
        """Add the flag to an argparse parser or group (its parsed default is None: not given)."""
        text = self.help + (f" (default {self.default})" if self.default is not None else "")
        if self.type is bool:
            parser.add_argument(f"--{self.name}", dest=self.dest, action=argparse.BooleanOptionalAction,
                                default=None, help=text)
            return
        metavar = self.metavar or ("|".join(map(str, self.choices)) if self.choices else self.name.upper())
        parser.add_argument(f"--{self.name}", dest=self.dest, type=self.type, default=None, metavar=metavar,
                            choices=list(self.choices) or None, help=text)


@dataclass(frozen=True)
class AxisSpec:
    """A mesh axis a strategy adds: a part of an existing axis with a degree of its own.

    ``within`` names the axis it is carved out of (``"dp"``): its ranks are the fastest
    ``degree`` of the parent's, so a group along ``name`` is a block of that many
    neighbouring ranks of a parent group, and a group along ``rest`` (default
    ``name + "r"``) takes one rank of each block.  The degree comes from the strategy
    option ``option`` (default 1: the axis is inactive).  Strategies shard over it as
    over any axis: ``Shard(dim)`` on ``name``.
    """

    name: str
    within: str
    option: str
    rest: str = ""
    description: str = ""

    @property
    def rest_name(self) -> str:
        return self.rest or self.name + "r"


@dataclass(frozen=True)
class StrategySpec:
    """A parallel strategy.

    ``axis`` is the mesh axis it drives (``"dp"``, ``"tp"``...) or ``None`` for
    strategies that change how the graph is run rather than how it is split
    (recompute).  ``validate(model, plan)`` returns a list of error strings (empty
    when the plan is valid for the model).  ``apply(graph, mesh, plan)`` returns
    the graph annotated with this strategy's placements (every installed strategy is
    applied to every plan; it leaves the graph alone when the plan does not ask for
    it).  ``options`` are its own flags
    (:class:`OptionSpec`); ``axes`` the mesh axes it adds (:class:`AxisSpec`).
    """

    name: str
    axis: str | None
    validate: Callable[[Any, Any], Sequence[str]]
    apply: Callable[[Any, Any, Any], Any]
    order: int = 100  # application order; lower first
    description: str = ""
    options: tuple[OptionSpec, ...] = ()
    axes: tuple[AxisSpec, ...] = ()
    plugin: str = ""


@dataclass(frozen=True)
class ScheduleSpec:
    """A pipeline schedule.

    ``order(stages, micro_batches, virtual)`` returns, for each pipeline rank, the
    list of steps it runs in order; a step is ``(kind, micro_batch, chunk)`` with kind
    ``"F"`` (forward), ``"B"`` (backward: all of it, or with ``"W"`` steps only the input
    gradients) or ``"W"`` (weight gradients), chunk the rank's own chunk index
    (:mod:`stage_core.schedule.steps` says what the host checks).  ``chunks``: the chunks
    per rank the schedule runs (ZB-V: 2; None: the plan's ``--virtual-stages``);
    ``placement``: which model chunk a rank's chunk is, ``"loop"`` (interleaved: rank i
    holds chunks i, i + pp, ...), ``"v"`` (down and back up: rank i holds chunks i and
    2·pp − 1 − i) or ``"dual"`` (DualPipe, ``chunks=2``: the model in pp chunks, rank i
    holding chunk i as its chunk 0 for the micro-batches fed from the first rank and chunk
    pp − 1 − i as its chunk 1 for those fed from the last; a micro-batch runs one of the two
    on every rank, and each gradient is summed over the two ranks holding its chunk).
    ``source``: where the schedule is published.  ``options``: the
    schedule's own flags (:class:`OptionSpec`, as a strategy's); ``order`` is called with
    each as a keyword argument named by its ``dest`` (``--round-size`` → ``round_size``),
    valued from the plan or the option's default, so give those parameters defaults.
    """

    name: str
    order: Callable[..., Sequence[Sequence[tuple[str, int, int]]]]
    description: str = ""
    chunks: int | None = None
    placement: str = "loop"
    source: str = ""
    options: tuple[OptionSpec, ...] = ()
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
    does the work and returns the process exit status.  ``args.stage_host`` is the
    :class:`~stage_core.plugins.PluginHost` the command line runs with (what to ask
    for models, hardware presets...).
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
    ``address``...); an executor ignores the ones it does not know.  ``options``: the
    settings it reads (None: not declared); a command refuses a setting given to an
    executor that declares it does not read it (``--address`` for ``local``).
    """

    name: str
    run: Callable[[Callable[[Any], Any], Sequence[Any], Mapping[str, Any]], Iterator[tuple[int, Any]]]
    description: str = ""
    plugin: str = ""
    options: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SimulatorSpec:
    """A simulator that runs a written trace set and reports its step.

    ``available()`` returns None when the simulator can run on this machine, else one
    line saying why not (no binary found...).  ``simulate(directory, hardware)`` runs
    the set in ``directory`` (written by a backend of ``formats``) on ``hardware`` (a
    :class:`HardwareSpec`; None: the hardware the set was timed for) and returns at
    least ``{"step_time_s": float, "finished": bool}``: the slowest rank's finish, and
    whether every rank finished.  It raises :class:`stage_core.errors.StageError` when
    the simulator cannot run the set.  ``time_limit_s``: simulated time after which the
    simulator stops (a longer step never finishes in it; ``stage estimate`` says so
    beforehand); None when it has no limit.  ``binary_env``: the environment variable
    ``simulate`` and ``available`` read the simulator's binary from, when they do (a
    command's ``--astra-sim BIN`` sets it for the run); None when it reads none.
    """

    name: str
    simulate: Callable[[Path, "HardwareSpec | None"], Mapping[str, Any]]
    available: Callable[[], "str | None"]
    formats: tuple[str, ...] = ("chakra",)
    description: str = ""
    plugin: str = ""
    time_limit_s: float | None = None
    binary_env: str | None = None


@dataclass(frozen=True)
class EstimatorSpec:
    """A step-time estimator: a plan's step without writing a set or running a simulator.

    ``estimate(result, hardware)`` takes what :func:`stage_core.flow.plan_job` returned
    for a plan timed on ``hardware`` (a :class:`HardwareSpec`; every compute node carries
    its ``duration_micros``) and returns at least ``{"step_time_s": float}``: the slowest
    rank's finish.  It may add ``mfu``, ``exposed_comm_s`` and, per rank class of
    ``result.job.programs``, when each node starts and finishes: ``node_start_s`` and
    ``node_finish_s`` (one list per class, one value per node in program order, seconds
    from the start of the step).  It raises :class:`stage_core.errors.UsageError` for a
    plan it cannot estimate.
    """

    name: str
    estimate: Callable[[Any, "HardwareSpec"], Mapping[str, Any]]
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
        from .planning import settings_flags

        return settings_flags(self.settings)

    @property
    def world_size(self) -> int:
        n = 1
        for axis in ("tp", "cp", "dp", "pp"):
            n *= int(self.settings.get(axis, 1))
        return n


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type: datasheet figures and the parameters its compute model reads.

    ``matmul_tflops`` is the dense tensor-core peak per input dtype (``"bf16"``,
    ``"fp16"``, ``"fp8"``, ``"fp32"`` meaning TF32), in 10^12 FLOPs per second;
    ``vector_tflops`` the FP32 peak of the ordinary cores (what elementwise math
    runs on); ``hbm_gbps`` the memory bandwidth in 10^9 bytes per second;
    ``sm_count`` the streaming multiprocessors (GEMM tiles are spread over them);
    ``memory_gib`` the HBM capacity in GiB (0: not given), what a rank's memory is shown beside.
    ``compute_model`` names the :class:`ComputeModelSpec` that times kernels on this
    GPU and ``parameters`` holds that model's named numbers.  ``sources`` says where
    each number comes from, keyed by field or parameter name.
    """

    name: str
    description: str
    matmul_tflops: Mapping[str, float]
    vector_tflops: float
    hbm_gbps: float
    sm_count: int
    compute_model: str = "roofline"
    memory_gib: float = 0.0
    parameters: Mapping[str, float] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor-core FLOPs per second for ``dtype`` (bf16's when the GPU lists no other)."""
        tflops = self.matmul_tflops.get(dtype)
        if tflops is None:
            tflops = self.matmul_tflops.get("bf16") or max(self.matmul_tflops.values())
        return tflops * 1e12


@dataclass(frozen=True)
class LinkSpec:
    """One tier of the network as a GPU sees it.

    ``bandwidth_gbps``: the datasheet bandwidth per GPU and direction, 10^9 bytes per
    second; ``efficiency``: the fraction of it a large collective reaches;
    ``latency_ns``: per link (a message between two GPUs crosses two: to the switch
    and from it).
    """

    name: str
    bandwidth_gbps: float
    efficiency: float
    latency_ns: float

    @property
    def bytes_per_second(self) -> float:
        """What a large transfer achieves on this tier."""
        return self.bandwidth_gbps * 1e9 * self.efficiency


@dataclass(frozen=True)
class HardwareSpec:
    """A node type: its GPU, GPUs per node, the links inside a node and across nodes.

    ``sources`` says where the network numbers come from (keyed ``"scale_up"``,
    ``"scale_out"`` ...); the GPU's own are in ``gpu.sources``.
    """

    name: str
    description: str
    gpu: GpuSpec
    gpus_per_node: int
    scale_up: LinkSpec
    scale_out: LinkSpec
    sources: Mapping[str, str] = field(default_factory=dict)
    plugin: str = ""


@dataclass(frozen=True)
class ComputeModelSpec:
    """A compute model: the time one kernel takes on one GPU.

    ``time(kernel, gpu)`` returns seconds (a float; rounding is the caller's).
    ``parameters`` maps each :attr:`GpuSpec.parameters` name the model reads to what
    it means.  ``fit(samples, gpu)``, when given, returns the parameters that best
    explain measured ``(kernel, seconds)`` samples on ``gpu`` (``stage calibrate``).
    """

    name: str
    time: Callable[["Kernel", GpuSpec], float]
    parameters: Mapping[str, str] = field(default_factory=dict)
    fit: Callable[[Sequence[tuple["Kernel", float]], GpuSpec], Mapping[str, float]] | None = None
    description: str = ""
    plugin: str = ""


@dataclass(frozen=True)
class PluginInfo:
    """What ``stage plugins`` reports about one plugin."""

    name: str
    source: str  # "builtin", "entrypoint" or "registered"
    version: str = ""
    provides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    error: str = ""
