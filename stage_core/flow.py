"""The whole flow, as functions: model -> training graph -> placements -> programs -> files.

    host = PluginHost()
    result = plan_job(host, "gpt-tiny", {}, Plan(dp=8))
    write_trace_set(host, result, Path("traces"), "chakra")
"""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping, Sequence

from . import __version__, guard, hardware
from .autodiff import OptimizerConfig, differentiate
from .checks import Degrees, axis_parts, check_declarations, check_model_graph, checked_order
from .bounds import (DEFAULT_MAX_NODES, MAX_WORLD, Extrapolated, check_lower_bound, check_model_size, check_world,
                     lower_within)
from .errors import StageError, TraceError, TraceReadError, TraceWriteError, UsageError
from .inputs import read_input, read_json
from .ir.builder import kernel_scope
from .ir.graph import Graph
from .kernels import KernelError
from .models import hf_import_of, keep_hf_import
from .output import COMM_GROUPS, MANIFEST, check_target, staging
from .parallel.inference import lower_inference
from .parallel.lower import ClassReport, Lowered, lower
from .parallel.mesh import GroupTable, Mesh
from .parallel.placement import ShardedGraph
from .parallel.plan import Plan
from .parallel.propagate import propagate
from .planning import DEFAULT_MODEL, DEFAULT_PLAN
from .plugins import PluginHost
from .rankset import ranks_text
from .records import HardwareSpec, ModelSpec, ScheduleSpec
from .tasks import CONTEXT, DECODE, PREFILL, inference_graph
from .timing import KernelTimer, time_programs
from .trace import TraceJob, TraceSet


#: which strategy a plan setting asks for
REQUESTED = {
    "dp": lambda p: p.dp > 1,
    "tp": lambda p: p.tp > 1,
    "sp": lambda p: p.sp,
    "cp": lambda p: p.cp > 1,
    "ep": lambda p: p.ep > 1,
    "pp": lambda p: p.pp > 1,
    "zero": lambda p: p.zero > 0,
    "recompute": lambda p: p.recompute != "none",
}


@dataclass
class Result:
    spec: ModelSpec
    config: Any
    plan: Plan
    forward: Graph
    training: Graph  # the graph the task runs: the training graph, or the prefill or decode graph
    sharded: ShardedGraph
    job: TraceJob
    reports: list[ClassReport]
    manifest: dict
    lowered: Lowered | None = None  # what lowering gave (an inference task's spans and cache layouts)
    warnings: list[str] = field(default_factory=list)  # what the user should know (stage prints them)


# --------------------------------------------------------------------------- model


def load_json_config(path: Path) -> dict:
    # a regular file of at most inputs.MAX_INPUT_BYTES, UTF-8, JSON of bounded depth and digits
    data = read_json(path, f"--model {path}")
    if not isinstance(data, dict):
        raise UsageError(f"--model {path}: expected a JSON object (a Hugging Face config.json)")
    return data


def resolve_model(host: PluginHost, model: str, overrides: Mapping[str, str] | None = None):
    """(ModelSpec, config) for a preset name or a path to a Hugging Face config.json."""
    path = Path(model)
    if model.endswith(".json") or path.is_file():
        data = load_json_config(path)
        config = host.config_from_hf(data)
        if config is None:
            types = ", ".join(host.hf_model_types()) or "none (no model plugin installed)"
            raise UsageError(
                f"--model {model}: model_type {data.get('model_type')!r} is not supported; "
                f"supported model_types: {types}{host.broken_hint()}"
            )
        spec = host.family(config.family)
        record = hf_import_of(config)
        if record is not None:
            record["source"] = str(path)
    else:
        spec, config = host.preset(model)
    if overrides:
        owner = host.owner(spec.plugin, "model family", spec.name)
        if hasattr(config, "with_overrides"):
            changed = guard.call(owner, "with_overrides", config.with_overrides, dict(overrides))
        else:
            merged = dict(guard.call(owner, "to_dict", config.to_dict))
            merged.update(overrides)
            changed = spec.from_dict(merged)
        config = keep_hf_import(config, changed)
    return spec, config


# --------------------------------------------------------------------------- plan


def _strategies(host: PluginHost, plan: Plan):
    registered = {s.name: s for s in host.strategies()}
    # a plan field asks for the strategy of that name, or any strategy that drives that axis
    missing = [name for name, asked in REQUESTED.items() if asked(plan) and name not in registered
               and not any(s.axis == name for s in registered.values())]
    if missing:
        have = ", ".join(sorted(registered)) or "none (install stage-parallel)"
        raise UsageError(
            f"the plan asks for {', '.join(missing)}, which no installed plugin provides; "
            f"installed strategies: {have}{host.broken_hint()}"
        )
    return sorted(registered.values(), key=lambda s: (s.order, s.name))


def _check_options(host: PluginHost, plan: Plan) -> None:
    """Every option the plan sets is declared by an installed strategy or by the plan's
    schedule, with a value of its type."""
    declared = {o.name: (s, o) for s, o in host.options()}
    for name, value in plan.options:
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise UsageError(f"plan option {name!r}: no installed strategy or schedule declares it (options: {known})")
        owner, opt = declared[name]
        if isinstance(owner, ScheduleSpec) and owner.name != plan.schedule:
            raise UsageError(f"--{name} {value}: an option of schedule {owner.name}; the plan runs --schedule "
                             f"{plan.schedule} (give --schedule {owner.name}, or leave --{name} out)")
        if opt.type is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if not isinstance(value, opt.type) or (opt.type is int and isinstance(value, bool)):
            raise UsageError(f"--{name} {value!r}: expected a {opt.type.__name__}")
        if opt.choices and value not in opt.choices:
            raise UsageError(f"--{name} {value}: valid values are {', '.join(map(str, opt.choices))}")


def plan_job(host: PluginHost, model: str = DEFAULT_MODEL, overrides: Mapping[str, str] | None = None,
             plan: Plan = DEFAULT_PLAN, gpu: HardwareSpec | None = None, *,
             max_nodes: int | None = DEFAULT_MAX_NODES, programs: bool = True) -> Result:
    """Everything up to the files: the programs, their reports and the manifest.

    With ``gpu`` (a hardware preset, see :func:`stage_core.hardware.resolve`) every
    compute node is timed by the GPU's compute model (``duration_micros``); the
    manifest then records the hardware and, per rank class, ``compute_time_us``.

    ``max_nodes`` bounds the set (nodes of all ranks together; None: no limit), checked
    before each costly step (:mod:`stage_core.bounds`).  ``programs=False`` when only the
    reports are wanted: a large micro-batch count is then extrapolated, the job has no
    programs, and ``max_nodes`` bounds only the world size.
    """
    plan.check_basic()
    check_world(plan, max_nodes)
    spec, config = resolve_model(host, model, overrides)
    model_owner = host.owner(spec.plugin, "model family", spec.name)
    if hasattr(config, "for_task"):
        config = guard.call(model_owner, "for_task", config.for_task, plan.task)
    check_model_size(spec, config)
    plan = resolve_lengths(plan, config)
    schedules = {s.name: s for s in host.schedules()}
    if plan.schedule not in schedules:
        raise UsageError(f"--schedule {plan.schedule}: unknown schedule; known: {', '.join(schedules)}"
                         f"{host.broken_hint()}")
    _check_options(host, plan)
    schedule = schedules[plan.schedule]
    order = checked_order(schedule, host.owner(schedule.plugin, "schedule", schedule.name),
                          {o.dest: plan.option(o.name, o.default) for o in schedule.options})
    if schedule.placement == "dual":  # DualPipe: two copies of one chunk a stage, not two virtual stages
        if plan.virtual_stages != 1:
            raise UsageError(f"--virtual-stages {plan.virtual_stages}: --schedule {schedule.name} cuts the model "
                             f"into pp chunks and runs two copies of them (one per direction); leave "
                             f"--virtual-stages out")
        if plan.inference:
            raise UsageError(f"--schedule {schedule.name}: its two copies of the model are for training "
                             f"(micro-batches fed from both ends); --task {plan.task} runs --schedule 1f1b or "
                             f"another one-copy schedule")
    elif schedule.chunks is not None and plan.pp > 1 and plan.virtual_stages != schedule.chunks:
        if plan.virtual_stages != 1:
            able = [s.name for s in schedules.values() if s.chunks in (None, plan.virtual_stages)]
            raise UsageError(f"--virtual-stages {plan.virtual_stages} needs a schedule that runs "
                             f"{plan.virtual_stages} chunks per pipeline stage ("
                             f"{' or '.join('--schedule ' + n for n in able) or 'none is installed'});"
                             f" {schedule.name} runs {schedule.chunks}")
        plan = plan.replace(virtual_stages=schedule.chunks)  # the schedule's own chunks (ZB-V's 2)
    strategies = _strategies(host, plan)

    forward, task_graph = model_graphs(spec, config, plan, model_owner)
    check_positions(plan, config.name, forward.meta.get("max_positions"))
    if plan.task == DECODE and not forward.caches:
        raise UsageError(f"--task {DECODE}: {config.name} keeps no cache between steps (an encoder's attention reads "
                         f"every token at once); it runs --task train or {PREFILL}")
    problems = []
    for s in strategies:
        problems += list(s.validate(forward, plan))
    if problems:
        raise UsageError(problems[0] if len(problems) == 1 else "; ".join(problems))
    set_limit = max_nodes if programs else None
    if set_limit is not None:
        check_lower_bound(len(forward.kernels()), plan, set_limit)

    training = task_graph()
    parts = axis_parts(strategies, plan, lambda s: host.owner(s.plugin, "strategy", s.name))
    mesh = Mesh.from_plan(plan, parts)
    sharded = ShardedGraph(training, Degrees(plan.degrees(), parts))
    for s in strategies:
        sharded = check_declarations(s.apply(sharded, mesh, plan), sharded, mesh.degrees,
                                     host.owner(s.plugin, "strategy", s.name))
        sharded.applied.append(s.name)
    prop = propagate(sharded)
    warnings = unsharded_axes(prop, plan, config.name)
    timer = None
    if gpu is not None:
        model_spec = host.compute_model(gpu.gpu.compute_model, gpu.gpu.name)
        timer = KernelTimer(model_spec, gpu)
    steps = step_dims(forward.dims, plan)
    if plan.inference:  # lowered in full: every step and micro-batch of requests
        lowered = lower_within(lambda p: lower_inference(prop, p, mesh, step_dims(forward.dims, p), order,
                                                         gpu, timer), plan, set_limit)
    else:
        lowered = lower_within(lambda p: lower(prop, p, mesh, steps[0], order, gpu, timer), plan, set_limit,
                               programs, order)
    groups = GroupTable(mesh, lowered.group_keys)
    manifest = make_manifest(config, plan, mesh.world_size, lowered.reports, lowered.stage_layers)
    if parts:  # the axes strategies carved out of others, with their degrees
        manifest["plan"]["axes"] = {x: mesh.degrees[x] for split in parts.values() for x in (split[0], split[2])}
    programs = lowered.programs
    if gpu is not None:
        if isinstance(lowered, Extrapolated):
            micros = lowered.compute_micros(timer)
        else:
            programs, micros = time_programs(programs, timer)
        manifest["hardware"] = hardware.to_dict(gpu)
        manifest["compute_model"] = model_spec.name
        for rc, us in zip(manifest["rank_classes"], micros):
            rc["compute_time_us"] = us
    else:
        manifest["kernel_times"] = hardware.ROOFLINE_NOTE
    if plan.inference:
        manifest["inference"] = cache_summary(training, steps[-1])
    job = TraceJob(
        programs=programs,
        world_size=mesh.world_size,
        comm_groups=groups.groups,
        group_name=groups.name,
        peer_rank=mesh.peer,
        group_ids=groups.ids,
        peer_ranks=mesh.peer_array,
        manifest=manifest,
        name=config.name,
    )
    return Result(spec, config, plan, forward, training, sharded, job, lowered.reports, manifest, lowered, warnings)


def unsharded_axes(prop, plan: Plan, model: str) -> list[str]:
    """A warning for each model-splitting degree above 1 (tp, cp, ep) that shards nothing of the
    model: every rank of such a group then computes the whole of what the others do."""
    out = []
    for axis, flag in (("tp", "--tp"), ("cp", "--cp"), ("ep", "--ep")):
        degree = plan.degrees().get(axis, 1)
        if degree <= 1:
            continue
        used = any(axis in axes for op_plan in prop.plans.values() for axes in op_plan.letter_axes.values())
        used = used or any(axis in kc.key.split("+") for op_plan in prop.plans.values() for kc in op_plan.kernel_comms)
        if not used:
            out.append(f"{flag} {degree}: no tensor of {model} is sharded over {axis}; each of its {degree} ranks "
                       f"computes the whole model (the installed strategies shard none of this model's dims)")
    return out


#: the model graphs of the last few models planned: plans of one model (a search, a sweep)
#: share them; a graph is never changed once built
_GRAPHS: dict[tuple, list] = {}
_GRAPHS_KEPT = 4


def model_graphs(spec: ModelSpec, config, plan: Plan, owner=None):
    """(forward graph, a function giving the graph the task runs) of ``config``, built once
    for the last few models asked for; the graph is checked (:func:`check_model_graph`),
    and the model's registered kernels are in scope while it is built."""
    owner = owner or guard.Owner(spec.plugin, kind="model family", name=spec.name)
    key = (spec.plugin, spec.name, json.dumps(guard.call(owner, "to_dict", config.to_dict), sort_keys=True,
                                              default=str))
    entry = _GRAPHS.pop(key, None)
    if entry is None:
        with kernel_scope(spec.kernels):
            entry = [check_model_graph(spec.build(config), owner), {}]
    _GRAPHS[key] = entry  # the most recent last
    while len(_GRAPHS) > _GRAPHS_KEPT:
        del _GRAPHS[next(iter(_GRAPHS))]
    forward, tasks = entry

    def task_graph() -> Graph:
        which = (plan.task, plan.optimizer_dtype)
        graph = tasks.get(which)
        if graph is None:
            try:
                if plan.inference:
                    graph = inference_graph(forward, plan.task)
                else:
                    graph = differentiate(forward, OptimizerConfig(state_dtype=plan.optimizer_dtype))
            except KernelError as exc:
                raise guard.fault(owner, str(exc)) from None
            tasks[which] = graph
        return graph

    return forward, task_graph


def resolve_lengths(plan: Plan, config) -> Plan:
    """The plan with its token counts filled in: the model's sequence length by default;
    decode computes one token per request and attends to --context-len (default: the
    model's sequence length).  A model whose config fixes its sequence (``SEQUENCE``
    ``"fixed"``: a ViT's patches) takes no other; one without a sequence dim (``"none"``:
    an image CNN) takes no --seq-len and keeps the plan's ``seq_len`` None."""
    default = getattr(config, "seq_len", None)
    sequence = getattr(config, "SEQUENCE", "tokens")
    if sequence != "tokens" and plan.task == DECODE:
        raise UsageError(f"--task {DECODE}: {config.name} generates no tokens one by one (it has "
                         f"{'no sequence' if sequence == 'none' else 'a fixed sequence'}); it runs --task train or "
                         f"{PREFILL}")
    if sequence == "none":
        if plan.seq_len is not None:
            raise UsageError(f"--seq-len {plan.seq_len}: {config.name} has no sequence dim (an image model: a micro-"
                             f"batch is --micro-batch-size images); leave --seq-len out")
        return plan
    if sequence == "fixed" and plan.seq_len is not None and plan.seq_len != default:
        raise UsageError(f"--seq-len {plan.seq_len}: {config.name}'s sequence is fixed by its config ({default} "
                         f"tokens); leave --seq-len out, or change the config (--set)")
    if plan.task == DECODE:
        if plan.seq_len is not None:
            raise UsageError(f"--seq-len {plan.seq_len}: decode computes one new token per request; give the "
                             f"tokens it attends to with --context-len")
        context = plan.context_len or default
        if not context:
            raise UsageError(f"model {config.name} has no default sequence length; give --context-len")
        return plan.replace(seq_len=1, context_len=int(context))
    seq_len = plan.seq_len or default
    if not seq_len:
        raise UsageError(f"model {config.name} has no default sequence length; give --seq-len")
    return plan.replace(seq_len=int(seq_len))


def check_positions(plan: Plan, name: str, max_positions: int | None) -> None:
    """Every token's position exists in the model (its rotary or learned position table)."""
    if not max_positions:
        return
    if plan.task == DECODE:
        last = plan.context_len + plan.decode_steps - 1
        if last > max_positions:
            steps = f" + --decode-steps {plan.decode_steps} - 1 = {last}" if plan.decode_steps > 1 else ""
            most = max_positions - plan.decode_steps + 1
            raise UsageError(f"--context-len {plan.context_len}{steps}: {name} has {max_positions} positions; "
                             f"give --context-len at most {most}")
    elif plan.seq_len is not None and plan.seq_len > max_positions:
        raise UsageError(
            f"--seq-len {plan.seq_len}: {name} has {max_positions} positions; give at most {max_positions}"
        )


def step_dims(model_dims: Mapping[str, int], plan: Plan) -> list[dict[str, int]]:
    """The dims each step binds, in order: one step, or one per decode step (context growing)."""
    dims = dict(model_dims)
    # the graph is the whole job's micro-batch: dp splits b back to micro_batch_size per rank
    dims["b"] = plan.micro_batch_size * plan.dp
    if plan.seq_len is not None:  # (a model without a sequence dim has none)
        dims["s"] = plan.seq_len
    if plan.task == DECODE:
        return [{**dims, CONTEXT: plan.context_len + j} for j in range(plan.decode_steps)]
    if plan.task == PREFILL and plan.seq_len is not None:
        dims[CONTEXT] = plan.seq_len
    return [dims]


def cache_summary(graph: Graph, dims: Mapping[str, int]) -> dict:
    """What the inference cache holds per request: at the last step's context, all layers,
    unsharded.  Recurrent states (fixed per request) count in the bytes, and apart in
    ``recurrent_state_bytes_per_request``; the elements per token are the growing caches'."""
    from .models import evaluate_sum

    one = {**dims, "b": 1}
    growing = [c for c in graph.caches if c.seq_dim is not None]
    states = [c for c in graph.caches if c.seq_dim is None]
    per_request = evaluate_sum([c.tensor.nbytes for c in graph.caches], one)
    elements = evaluate_sum([c.tensor.numel for c in growing], {**one, CONTEXT: 1})
    layers = len({op.layer for op in graph.ops if op.fn == "cache_write" and not op.attrs.get("state")}) or 1
    return {"task": graph.meta.get("task"), "context_len": dims.get(CONTEXT) if graph.caches else None,
            "kv_cache_bytes_per_request": per_request,
            "recurrent_state_bytes_per_request": evaluate_sum([c.tensor.nbytes for c in states], one),
            "kv_cache_elements_per_token": elements,
            "kv_cache_elements_per_token_per_layer": elements // layers if elements % layers == 0 else elements / layers}


def largest_batch(manifest: Mapping, gpu_memory: int) -> int:
    """The most requests per data-parallel replica whose cache and working set fit beside
    the weights in ``gpu_memory`` bytes on every rank (both grow with the requests)."""
    plan = manifest["plan"]
    requests = plan["micro_batch_size"] * plan["micro_batches"]
    most = None
    for rc in manifest["rank_classes"]:
        mem = rc["memory_bytes"]
        per_request = (mem.get("kv_cache", 0) + mem["activations"]) / requests
        room = gpu_memory - mem["parameters"]
        fits = 0 if room < 0 else int(room // per_request) if per_request else requests
        most = fits if most is None else min(most, fits)
    return most or 0


def make_manifest(config, plan: Plan, world_size: int, reports: list[ClassReport],
                  stage_layers: tuple[int, ...] = ()) -> dict:
    return {
        "stage_version": __version__,
        "format": "chakra-et-0.0.4",
        "units": {"compute": "FLOPs", "sizes": "bytes"},
        "model": config.to_dict(),
        "plan": {
            "dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "cp_comm": plan.cp_comm, "ep": plan.ep,
            "sp": plan.sp,
            "zero": plan.zero, "recompute": plan.recompute, "schedule": plan.schedule,
            "virtual_stages": plan.virtual_stages, "micro_batch_size": plan.micro_batch_size,
            "micro_batches": plan.micro_batches, "seq_len": plan.seq_len, "order": plan.order,
            "global_batch": plan.global_batch, "grad_dtype": plan.grad_dtype,
            "optimizer_dtype": plan.optimizer_dtype, "stage_layers": list(stage_layers), "task": plan.task,
            "context_len": plan.context_len, "decode_steps": plan.decode_steps,
            "etp": plan.expert_tp, "edp": plan.expert_dp, "moe_dispatcher": plan.moe_dispatcher,
            "moe_capacity_factor": plan.moe_capacity_factor, "moe_imbalance": plan.moe_imbalance,
            **({"options": dict(plan.options)} if plan.options else {}),
        },
        "world_size": world_size,
        "rank_classes": [r.to_dict() for r in reports],
        **({"hf_import": hf_import_of(config)} if hf_import_of(config) is not None else {}),
    }


# --------------------------------------------------------------------------- files


def check_output_dir(out: str | os.PathLike) -> Path:
    """The folder ``-o out`` names, after checking that a set may replace it
    (:func:`stage_core.output.check_target`: one-line UsageError otherwise)."""
    return check_target(out)


def write_trace_set(host: PluginHost, result: Result, out: str | os.PathLike, fmt: str = "chakra", *,
                    validate: bool = True, ranks: Sequence[int] | None = None, workers: int | None = None,
                    progress: Progress | None = None) -> Path:
    """Write the set into a temporary folder beside ``out``, check it, then rename it into place.

    ``out`` may be replaced only when it is absent, empty or a STAGE trace set (see
    :mod:`stage_core.output`).  A failure at any point leaves ``out`` as it was.

    ``ranks`` (ascending, distinct; None: all) writes those ranks' files only; the
    manifest's ``"subset"`` says which.  ``workers``: processes writing the files
    (None: one per core).  ``progress(label, total)``, when given, is a context
    manager yielding a function told how many more of ``total`` are done.
    """
    backend = host.backend(fmt)
    target = check_target(out)
    manifest = dict(result.manifest)
    manifest["format"] = backend.format_id or backend.name
    manifest["rank_classes"] = [dict(rc) for rc in manifest["rank_classes"]]
    if ranks is not None:
        manifest["subset"] = {"ranks": ranks_text(ranks), "count": len(ranks)}
    files = result.job.world_size if ranks is None else len(ranks)
    with staging(target, f"-o {out}") as tmp:
        with _phase(progress, "writing", files) as done:
            try:
                backend.write(replace(result.job, ranks=ranks, workers=workers, progress=done), tmp)
            except (ValueError, OverflowError) as exc:
                if isinstance(exc, StageError):
                    raise
                raise TraceWriteError(f"the {backend.name} writer cannot write this job: {exc}") from exc
        (tmp / COMM_GROUPS).write_text(comm_groups_json(result.job.comm_groups))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if validate and backend.read is not None:
            from .validate import validate as run_checks

            trace_set = open_trace_set(backend, tmp)
            costs: dict = {}
            with _phase(progress, "validating", files) as done:
                problems = run_checks(_counted(trace_set, done), costs=costs)
            if problems:
                raise TraceError([str(p) for p in problems])
            # the programs as read back and validated: a later change of any node shows
            for rc in manifest["rank_classes"]:
                digests = {costs[r].program for r in rc["ranks"] if r in costs}
                if len(digests) == 1:  # (a class of one program; a served set's ranks differ)
                    rc["program_sha256"] = digests.pop()
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return Path(out)


def comm_groups_json(groups: Mapping[str, Sequence[int]]) -> str:
    """``comm_groups.json``: one group a line (a 131,072-rank set has 24,704 groups)."""
    lines = ",\n".join(f"{json.dumps(str(name))}: {json.dumps(list(members))}" for name, members in groups.items())
    return "{\n" + lines + "\n}\n" if lines else "{}\n"


#: ``progress(label, total)`` -> a context manager yielding ``update(n)``
Progress = Callable[[str, int], ContextManager[Callable[[int], None]]]


def _phase(progress: Progress | None, label: str, total: int) -> ContextManager:
    return nullcontext(None) if progress is None else progress(label, total)


def _counted(trace_set: TraceSet, done: Callable[[int], None] | None) -> TraceSet:
    """``trace_set``, telling ``done(1)`` after each rank it hands out."""
    if done is None:
        return trace_set

    def iter_ranks():
        for item in trace_set.iter_ranks():
            yield item
            done(1)

    return replace(trace_set, iter_ranks=iter_ranks)


#: what a backend's reader may raise for a bad file, other than a StageError
_READ_ERRORS = (OSError, ValueError, EOFError, RecursionError, OverflowError)


def open_trace_set(backend, directory: Path) -> TraceSet:
    """``backend.read(directory)``, every error of reading the set a StageError: the
    backend's own (:class:`TraceReadError` names the file, rank and byte) or, from a
    reader that raises a plain error, a TraceReadError naming the folder."""
    try:
        trace_set = backend.read(directory)
    except _READ_ERRORS as exc:
        if isinstance(exc, StageError):
            raise
        raise TraceReadError(f"the {backend.name} reader cannot open it: {exc}", path=directory) from exc
    manifest = read_manifest(Path(directory))
    if manifest is not None:
        trace_set = replace(trace_set, metadata={**(trace_set.metadata or {}), "manifest": manifest})
    inner = trace_set.iter_ranks

    def iter_ranks():
        last = None
        try:
            for last, nodes in inner():
                yield last, nodes
        except _READ_ERRORS as exc:
            if isinstance(exc, StageError):
                raise
            which = "the first rank" if last is None else f"the rank after rank {last}"
            raise TraceReadError(f"the {backend.name} reader failed on {which}: {exc}", path=directory) from exc

    return replace(trace_set, iter_ranks=iter_ranks)


#: the largest manifest.json read (a 2**20-rank set's lists its ranks: some 8 MB)
MAX_MANIFEST_BYTES = 1 << 28


def read_manifest(directory: Path) -> Any:
    """The parsed ``manifest.json`` of the set in ``directory`` (validate checks it); None
    when there is none (a set of another generator).  A FIFO, a file above
    MAX_MANIFEST_BYTES or one that is not JSON is a TraceReadError naming it."""
    path = directory / MANIFEST
    if not os.path.lexists(path):
        return None
    try:
        data = read_input(path, "manifest.json", MAX_MANIFEST_BYTES)
        return json.loads(data.decode("utf-8"))
    except UsageError as exc:
        raise TraceReadError(str(exc).removeprefix("manifest.json: "), path=path) from None
    except UnicodeDecodeError as exc:
        raise TraceReadError(f"not UTF-8 text ({exc.reason})", path=path, offset=exc.start) from None
    except (ValueError, RecursionError) as exc:
        raise TraceReadError(f"not JSON ({'nested too deep' if isinstance(exc, RecursionError) else exc})",
                             path=path) from None


def check_manifest_world(directory: Path) -> None:
    """Refuse, before a reader lays anything out per rank, a manifest naming more ranks
    than STAGE handles (a world of 10**12 would be 10**12 of everything)."""
    manifest = read_manifest(directory)
    world = manifest.get("world_size") if isinstance(manifest, dict) else None
    if type(world) is int and world > MAX_WORLD:
        raise TraceReadError(f"world_size {world:,} is above the {MAX_WORLD:,} ranks STAGE reads and checks",
                             path=directory / MANIFEST)


def read_trace_set(host: PluginHost, directory: Path):
    """Decode a trace set with the backend whose files it holds."""
    if not directory.is_dir():
        raise UsageError(f"{directory}: no such folder")
    check_manifest_world(directory)
    for b in host.backends():
        if b.read is not None and b.detect is not None and b.detect(directory):
            return open_trace_set(b, directory)
    known = ", ".join(b.name for b in host.backends()) or "none installed"
    raise UsageError(f"{directory}: holds no trace set of a known format (formats: {known}){host.broken_hint()}")
