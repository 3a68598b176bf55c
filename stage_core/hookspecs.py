"""The plugin contract: every hook a STAGE plugin may implement.

A plugin is a module (or object) with functions decorated by
:data:`stage_core.hookimpl`.  It is found through the entry-point group ``stage``
(third parties) or registered by module name (built-ins).  Registration hooks
return lists of frozen records from :mod:`stage_core.records`; the host collects
them, rejects duplicate names (naming both plugins) and sorts them by name, so
pluggy's call order never shows.

Hooks, by lifecycle:

1. what exists: :func:`stage_models`, :func:`stage_strategies`,
   :func:`stage_schedules`, :func:`stage_trace_backends`, :func:`stage_commands`,
   :func:`stage_executors`, :func:`stage_plans`,
   :func:`stage_hardware`, :func:`stage_compute_models`, :func:`stage_simulators`,
   :func:`stage_estimators`
2. resolving input: :func:`stage_config_from_hf`
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pluggy

from .records import (BackendSpec, CommandSpec, ComputeModelSpec, EstimatorSpec, ExecutorSpec, HardwareSpec, ModelSpec,
                      PlanSpec, ScheduleSpec, SimulatorSpec, StrategySpec)

PROJECT = "stage"

_hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ----------------------------------------------------------------- 1. what exists


@_hookspec
def stage_models() -> Sequence[ModelSpec]:
    """Register model families and their presets.

    :return: a list of :class:`~stage_core.records.ModelSpec`, one per family.

    Example::

        @hookimpl
        def stage_models():
            return [ModelSpec(name="gpt", family="gpt", build=build_gpt,
                              presets={"gpt-tiny": GPTConfig(...)},
                              from_dict=GPTConfig.from_dict,
                              hf_model_types=("gpt2",))]
    """


@_hookspec
def stage_strategies() -> Sequence[StrategySpec]:
    """Register parallel strategies (dp, tp, zero, recompute, ...).

    :return: a list of :class:`~stage_core.records.StrategySpec`.

    Example::

        @hookimpl
        def stage_strategies():
            return [StrategySpec(name="dp", axis="dp", validate=check_dp,
                                 apply=apply_dp)]
    """


@_hookspec
def stage_schedules() -> Sequence[ScheduleSpec]:
    """Register pipeline schedules (gpipe, 1f1b, interleaved, ...).

    :return: a list of :class:`~stage_core.records.ScheduleSpec`.

    Example::

        @hookimpl
        def stage_schedules():
            def gpipe(stages, micro_batches, virtual):
                return [[("F", m, 0) for m in range(micro_batches)]
                        + [("B", m, 0) for m in reversed(range(micro_batches))]
                        for _ in range(stages)]
            return [ScheduleSpec(name="gpipe", order=gpipe)]
    """


@_hookspec
def stage_trace_backends() -> Sequence[BackendSpec]:
    """Register trace backends (output formats).

    :return: a list of :class:`~stage_core.records.BackendSpec`.

    Example::

        @hookimpl
        def stage_trace_backends():
            return [BackendSpec(name="chakra", write=write_chakra, read=read_chakra,
                                detect=lambda d: any(d.glob("trace.*.et")))]
    """


@_hookspec
def stage_commands() -> Sequence[CommandSpec]:
    """Register extra ``stage`` subcommands.

    :return: a list of :class:`~stage_core.records.CommandSpec`.

    Example::

        @hookimpl
        def stage_commands():
            def configure(p):
                p.add_argument("dir")
            def run(args):
                print(args.dir)
                return 0
            return [CommandSpec(name="echo-dir", help="print DIR", configure=configure,
                                run=run)]
    """


@_hookspec
def stage_executors() -> Sequence[ExecutorSpec]:
    """Register executors: ways to run the independent points of a sweep.

    :return: a list of :class:`~stage_core.records.ExecutorSpec`.

    Example::

        @hookimpl
        def stage_executors():
            def serial(fn, items, options):
                for i, item in enumerate(items):
                    yield i, fn(item)
            return [ExecutorSpec(name="serial", run=serial,
                                 description="one point after the other, in this process")]
    """


@_hookspec
def stage_plans() -> Sequence[PlanSpec]:
    """Register named parallel plans (published training setups) for ``--plan NAME``.

    :return: a list of :class:`~stage_core.records.PlanSpec`.

    Example::

        @hookimpl
        def stage_plans():
            return [PlanSpec(name="gpt3-175b-megatron",
                             settings={"model": "gpt3-175b", "tp": 8, "pp": 8, "dp": 16,
                                       "schedule": "interleaved", "virtual-stages": 2},
                             description="GPT-3 175B as Megatron-LM trains it",
                             source="Narayanan et al. 2021")]
    """


@_hookspec
def stage_hardware() -> Sequence[HardwareSpec]:
    """Register hardware presets: a GPU with its compute-model parameters, and its network.

    ``stage generate --gpu NAME``, ``stage astrasim --system NAME`` and estimators look
    presets up by name.  Give every number a source (``GpuSpec.sources``,
    ``HardwareSpec.sources``).

    :return: a list of :class:`~stage_core.records.HardwareSpec`.

    Example::

        @hookimpl
        def stage_hardware():
            gpu = GpuSpec(name="a100", description="A100 SXM4 80GB",
                          matmul_tflops={"bf16": 312.0}, vector_tflops=19.5,
                          hbm_gbps=2039.0, sm_count=108,
                          sources={"matmul_tflops": "NVIDIA A100 datasheet"})
            return [HardwareSpec(name="a100", description="DGX A100", gpu=gpu,
                                 gpus_per_node=8,
                                 scale_up=LinkSpec("NVLink 3", 300.0, 0.95, 936.25),
                                 scale_out=LinkSpec("InfiniBand HDR", 25.0, 0.95, 2643.5))]
    """


@_hookspec
def stage_compute_models() -> Sequence[ComputeModelSpec]:
    """Register compute models: functions that time one kernel on one GPU.

    A GPU names its model (``GpuSpec.compute_model``) and carries the model's
    parameters (``GpuSpec.parameters``); the model reads them in ``time``.

    :return: a list of :class:`~stage_core.records.ComputeModelSpec`.

    Example::

        @hookimpl
        def stage_compute_models():
            def time(kernel, gpu):  # the roofline
                return max(kernel.matmul_flops / gpu.peak_flops(kernel.dtype),
                           kernel.bytes / (gpu.hbm_gbps * 1e9))
            return [ComputeModelSpec(name="roofline", time=time)]
    """


@_hookspec
def stage_simulators() -> Sequence[SimulatorSpec]:
    """Register simulators that run a written trace set (``stage search`` confirms its
    best plans with them; ``stage sweep`` measures ``simulate`` with them).

    :return: a list of :class:`~stage_core.records.SimulatorSpec`.

    Example::

        @hookimpl
        def stage_simulators():
            def available():
                return None if shutil.which("mysim") else "mysim is not on PATH"
            def simulate(directory, hardware):
                finish = run_mysim(directory, hardware)  # seconds per rank
                return {"step_time_s": max(finish), "finished": len(finish) == world}
            return [SimulatorSpec(name="mysim", simulate=simulate, available=available)]
    """


@_hookspec
def stage_estimators() -> Sequence[EstimatorSpec]:
    """Register step-time estimators: a planned job's step on a GPU and its network,
    without a simulator (``stage dataset`` labels its graphs with one; stage-search
    registers ``replay``, what ``stage estimate`` prints).

    :return: a list of :class:`~stage_core.records.EstimatorSpec`.

    Example::

        @hookimpl
        def stage_estimators():
            def serial(result, hardware):  # every kernel of the busiest class, one after the other
                busiest = max(sum(n.duration_micros for n in p.nodes) for p in result.job.programs)
                return {"step_time_s": busiest * 1e-6}
            return [EstimatorSpec(name="serial", estimate=serial,
                                  description="compute only: no communication, no overlap")]
    """


# ----------------------------------------------------------------- 2. resolving input


@_hookspec(firstresult=True)
def stage_config_from_hf(hf_config: Mapping[str, Any]) -> Any | None:
    """Turn a Hugging Face ``config.json`` (already parsed) into a model config.

    A family usually declares how it reads config.json instead, as data: an
    :class:`~stage_core.models.HFReader` in its ``ModelSpec.hf_reader`` (the keys it
    requires and reads), and the host picks the family whose keys a config has.  This
    hook answers first, for a plugin that reads config.json its own way.

    Stops at the first non-None result.  Return ``None`` when your plugin does not
    handle ``hf_config["model_type"]``; raise
    :class:`stage_core.errors.UsageError` naming the key when you handle the type
    but a value is invalid.  Built-in fallbacks should be marked
    ``@hookimpl(trylast=True)`` so any other plugin can take precedence.

    :param hf_config: the parsed JSON object.
    :return: a config object of one of your registered families, or ``None``.

    Example::

        @hookimpl
        def stage_config_from_hf(hf_config):
            if hf_config.get("model_type") != "gpt2":
                return None
            return GPTConfig(name="hf-gpt2", hidden=hf_config["n_embd"], ...)
    """
