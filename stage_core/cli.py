"""``stage``: the command line.

Every user mistake ends with one line on stderr and exit status 2; a trace set
that fails validation with its problems and exit status 1; anything else is a bug
and shows its traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from . import __version__, hardware
from .flow import (_counted, check_output_dir, largest_batch, model_graphs, plan_job, read_trace_set, resolve_model,
                   write_trace_set)
from .errors import PluginError, StageError, TraceError, UsageError
from .models import hf_import_of, layer_kinds, param_counts
from .newplugin import KINDS, write_skeleton
from .parallel.plan import Plan
from .planning import _Parser, _host_choice_flag, _overrides, add_gpu_flag, add_plan_flags, plan_from_args
from .plugins import PluginHost
from .progress import Progress, add_quiet_flag
from .rankset import parse_ranks, ranks_text
from .presets import preset_rows
from .reporting import (GiB, TRAFFIC_NOTE, compute_memory_table, count_text, fit_line, gib, memory_fit, memory_text,
                        plural, table, traffic_table)
from .serve import parse_side, plan_serve, side_plans
from .tasks import SERVE

PROG = "stage"
#: memory per GPU for the largest inference batch when neither --gpu-memory nor --gpu gives it
DEFAULT_GPU_MEMORY_GIB = 80
DEFAULT_GPU_MEMORY = DEFAULT_GPU_MEMORY_GIB * GiB


# --------------------------------------------------------------------------- commands


#: the GPU `stage generate` and `stage report` time kernels on when no --gpu is given
#: (``--gpu none``: untimed, the simulator's roofline times them)
DEFAULT_GPU = "h100"


def _gpu(host: PluginHost, name: str | None, default: str | None = None):
    return hardware.resolve_or_none(host, name, default)


def _max_nodes(args) -> int:
    if args.max_nodes < 1:
        raise UsageError(f"--max-nodes {args.max_nodes}: must be a positive integer")
    return args.max_nodes


def cmd_generate(host: PluginHost, args) -> int:
    req = plan_from_args(args, host)
    _print_notes(req)
    plan = req.plan
    check_output_dir(args.output)  # before any work
    out = Path(args.output)
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: must be a positive integer (processes writing files)")
    world = plan.world_size
    if plan.task == SERVE and req.serve["prefill-ranks"] and req.serve["decode-ranks"]:
        world = req.serve["prefill-ranks"] + req.serve["decode-ranks"]
    ranks = None if args.ranks is None else parse_ranks(args.ranks, world)
    gpu = _gpu(host, req.gpu, DEFAULT_GPU)
    start = time.perf_counter()
    progress = progress_of(args)
    with progress.phase("planning"):
        result = _plan_task(host, req, gpu, max_nodes=_max_nodes(args))
    _print_warnings(result)
    world = result.job.world_size
    write_trace_set(host, result, args.output, args.format, validate=not args.no_validate, ranks=ranks,
                    workers=args.workers, progress=progress)
    seconds = time.perf_counter() - start
    written = world if ranks is None else len(ranks)
    nodes = sum(len(p.nodes) * len(p.ranks) for p in result.job.programs)
    if ranks is not None:
        chosen = set(ranks)
        nodes = sum(len(p.nodes) * len(chosen.intersection(p.ranks)) for p in result.job.programs)
    what = f"{result.config.name}, {_plan_text(result.plan)}"
    if plan.task == SERVE:
        P = result.prefill.job.world_size
        what = (f"{result.config.name}, serve: prefill ranks 0-{P - 1} {_plan_text(result.prefill.plan)}, "
                f"decode ranks {P}-{world - 1} {_plan_text(result.decode.plan)}")
    if req.used_default:
        what += " (the default job)"
    check = "" if args.no_validate else ", validated"
    count = f"{world} traces" if ranks is None else f"{written} of {world} traces (ranks {ranks_text(ranks)})"
    classes = plural(len(result.job.programs), "rank class" if plan.task != SERVE else "program")
    print(f"wrote {count} ({what}; {classes}, {nodes:,} nodes) to {out}/ in {seconds:.2f} s{check}")
    if gpu is not None:
        longest = max(rc["compute_time_us"] for rc in result.manifest["rank_classes"])
        given = "" if req.gpu else f" (the default; --gpu NAME for another, --gpu {hardware.UNTIMED} for none)"
        print(f"timed on {gpu.name}{given} ({result.manifest['compute_model']} compute model): "
              f"up to {longest / 1e3:,.3f} ms of compute per GPU per step")
        _print_fit(result.manifest["rank_classes"], gpu)
    else:
        print("untimed: the simulator's roofline will time every kernel (its system's peak-perf and local-mem-bw); "
              f"--gpu NAME times them here")
        _warn_zero_first_kernel(host, result.job.programs)
    return 0


def _print_fit(classes, gpu) -> None:
    """The memory fit line: on stdout when every rank fits its GPU, a warning on stderr when not."""
    line = fit_line(classes, gpu)
    if not line:
        return
    if line.endswith("does NOT fit"):
        print(one_line(f"{PROG}: warning: {line}"), file=sys.stderr)
    else:
        print(line)


def _print_warnings(result) -> None:
    for text in getattr(result, "warnings", ()):
        print(one_line(f"{PROG}: warning: {text}"), file=sys.stderr)


def rooflines(host: PluginHost) -> dict[str, tuple[float, float]]:
    """The registered GPUs' rooflines as ASTRA-sim's system.json gives them: {name: (peak
    TFLOPS bf16, HBM GB/s)} (what generate warns about and validate's verdict uses); a roofline two
    presets share (a GPU's variants, ``a100`` and ``a100-calibrated``) is named once, by the first."""
    out: dict[str, tuple[float, float]] = {}
    for hw in host.hardware():
        roof = (hw.gpu.peak_flops("bf16") / 1e12, hw.gpu.hbm_gbps)
        if roof not in out.values():
            out[hw.name] = roof
    return out


def _warn_zero_first_kernel(host: PluginHost, programs) -> None:
    """Say so when a class's first kernel takes 0 ns on a known GPU's roofline: ASTRA-sim
    would abort on that set at its first tick (the set itself is sound; stage validate says
    the same of the written set)."""
    gpus = rooflines(host)
    for program in programs:
        node = hardware.first_kernel(program.nodes)
        if node is None:
            continue
        zero = [name for name, (peak, bandwidth) in sorted(gpus.items())
                if hardware.roofline_ns(node.num_ops, node.tensor_size, peak, bandwidth) == 0]
        if zero:
            print(f"{PROG}: warning: the first kernel of ranks {ranks_text(program.ranks)} ({node.name}, "
                  f"{node.tensor_size} bytes) takes under 1 ns on the roofline of {', '.join(zero)}, and "
                  f"{hardware.TICK_ZERO}; give --gpu NAME to time the kernels, or a larger batch", file=sys.stderr)
            return


def progress_of(args) -> Progress:
    """How a command shows its phases (``--quiet``: not at all; see :mod:`stage_core.progress`)."""
    return Progress.for_args(args)


def _plan_text(plan: Plan) -> str:
    parts = [f"{a}{plan.degree(a)}" + (f"({plan.cp_comm})" if a == "cp" else "")
             for a in ("tp", "cp", "ep", "dp", "pp") if plan.degree(a) > 1] or ["1 GPU"]
    if plan.expert_tp != plan.tp:
        parts.append(f"etp{plan.expert_tp}")
    if plan.sp:
        parts.append("sp")
    if plan.zero:
        parts.append(f"zero{plan.zero}")
    if plan.recompute != "none":
        parts.append(f"recompute={plan.recompute}")
    parts.append(f"mbs{plan.micro_batch_size}x{plan.micro_batches}")
    if plan.task == "decode":
        parts.append(f"decode ctx{plan.context_len}" + (f" x{plan.decode_steps} steps" if plan.decode_steps > 1 else ""))
    else:  # (a model without a sequence dim has no seq_len: its micro-batch counts images)
        parts += ([f"seq{plan.seq_len}"] if plan.seq_len is not None else []) + (
            [plan.task] if plan.task != "train" else [])
    return " ".join(parts)


def _step_text(plan: Plan) -> str:
    if plan.task == "decode" and plan.decode_steps > 1:
        return f"trace of {plan.decode_steps} decode steps"
    return f"{plan.task if plan.task != 'train' else 'training'} step"


def cmd_report(host: PluginHost, args) -> int:
    req = plan_from_args(args, host)
    _print_notes(req)
    plan = req.plan
    gpu = _gpu(host, req.gpu, DEFAULT_GPU)  # as generate times the set, so the two agree
    gpu_memory, memory_from = _gpu_memory(args, gpu)
    if args.gpu_memory is not None and not plan.inference:
        raise UsageError(f"--gpu-memory {args.gpu_memory:g}: sizes the largest batch of --task prefill, decode or "
                         f"serve; a training plan's memory is shown beside its GPU's with --gpu NAME")
    result = _plan_task(host, req, gpu, max_nodes=_max_nodes(args), programs=False)
    _print_warnings(result)
    if plan.task == SERVE:
        return _report_serve(result, gpu, gpu_memory, memory_from, args.json)
    m = _with_largest_batch(result.manifest, gpu_memory, memory_from)
    total, active = param_counts(result.forward)
    if args.json:
        fit = memory_fit(m["rank_classes"], gpu)
        print(json.dumps({**m, "parameters": {"total": total, "active": active},
                          **({"memory_fit": fit} if fit else {})}, indent=2))
        return 0
    named = f"  (plan {req.plan_name})" if req.plan_name else ""
    print(f"{result.config.name}  {_plan_text(result.plan)}  world {m['world_size']:,}{named}")
    exact = f"{total:,}" if total == active else f"{total:,} and {active:,}"
    print(f"parameters: {count_text(total)} total, {count_text(active)} active per token ({exact})")
    print(f"per rank, per {_step_text(result.plan)}")
    _print_classes(m, result.plan, gpu)
    if "inference" in m:
        _print_cache(m, result.plan)
    return 0


def _print_notes(req) -> None:
    """What the settings changed that the user may not expect (a named plan's batch)."""
    for text in req.notes:
        print(one_line(f"{PROG}: note: {text}"), file=sys.stderr)


def _with_largest_batch(m: dict, gpu_memory: int, memory_from: str = "") -> dict:
    if "inference" not in m:
        return m
    return {**m, "inference": {**m["inference"], "gpu_memory_bytes": gpu_memory, "gpu_memory_from": memory_from,
                               "largest_batch": largest_batch(m, gpu_memory)}}


def _print_classes(m: dict, plan: Plan, gpu) -> None:
    """The report's tables: compute and memory, then traffic, one row per rank class."""
    if m.get("hf_import", {}).get("ignored_keys"):
        print(f"{m['hf_import']['source']}: keys not modelled (ignored): {', '.join(m['hf_import']['ignored_keys'])}")
    layers = m["plan"].get("stage_layers") or []
    if plan.pp > 1 and len(layers) != plan.pp:
        print(f"layers per pipeline chunk: {','.join(map(str, layers))}")
    label = "stage" if plan.pp > 1 else "class"
    print()
    for line in compute_memory_table(m, gpu, label):
        print(line)
    line = fit_line(m["rank_classes"], gpu, label if plan.pp > 1 and len(m["rank_classes"]) == plan.pp else "")
    if line:
        print(line)
    if "compute_time_us" in m["rank_classes"][0]:
        print(f"compute: timed on {m['hardware']['name']} ({m['compute_model']} compute model)")
    traffic = traffic_table(m, label)
    print()
    if not traffic:
        print("traffic per rank: none")
        return
    for line in traffic:
        print(line)
    print(f"({TRAFFIC_NOTE})")


def _plan_task(host: PluginHost, req, gpu, **kw):
    """plan_job, or for --task serve both sides' plans and the KV transfers between them."""
    plan, serving = req.plan, req.serve
    if plan.task != SERVE:
        stray = [name for name, value in serving.items() if value is not None]
        if stray:
            raise UsageError(f"--{stray[0]} splits the ranks between prefill and decode; it needs --task serve")
        return plan_job(host, req.model, req.overrides, plan, gpu, **kw)
    plan.check_task()  # each side's plan_job checks the rest (ep is carved out of the side's own dp)
    world = plan.world_size if "dp" in req.given else None  # the main flags name a world when --dp is given
    prefill, decode = side_plans(plan, serving["prefill-ranks"], serving["decode-ranks"],
                                 parse_side(serving["prefill-plan"], "--prefill-plan"),
                                 parse_side(serving["decode-plan"], "--decode-plan"), world)
    return plan_serve(host, req.model, req.overrides, prefill, decode, gpu)


def _report_serve(result, gpu, gpu_memory: int, memory_from: str, as_json: bool) -> int:
    sides = [(name, side, _with_largest_batch(side.manifest, gpu_memory, memory_from))
             for name, side in (("prefill", result.prefill), ("decode", result.decode))]
    kv = result.manifest["kv_transfer"]
    if as_json:
        m = dict(result.manifest)
        m["inference"] = {name: manifest["inference"] for name, _, manifest in sides}
        fit = memory_fit(m["rank_classes"], gpu)
        print(json.dumps({**m, **({"memory_fit": fit} if fit else {})}, indent=2))
        return 0
    P = result.prefill.job.world_size
    print(f"{result.config.name}  serve: prefill ranks 0-{P - 1}, decode ranks {P}-{result.job.world_size - 1}")
    for name, side, manifest in sides:
        offset = 0 if name == "prefill" else P
        shifted = {**manifest, "rank_classes": [{**rc, "ranks": [r + offset for r in rc["ranks"]]}
                                                for rc in manifest["rank_classes"]]}
        print(f"\n{name}: {_plan_text(side.plan)}  (per rank, per {_step_text(side.plan)})")
        _print_classes(shifted, side.plan, gpu)
        _print_cache(shifted, side.plan)
    print(f"KV cache transfer: {kv['requests']} requests, {memory_text(kv['bytes'])} ({kv['bytes']:,} bytes) in "
          f"{kv['messages']:,} send/recv pairs ({memory_text(kv['bytes_per_request'])} per request; up to "
          f"{memory_text(kv['max_sent_per_prefill_rank'])} sent by a prefill rank, "
          f"{memory_text(kv['max_received_per_decode_rank'])} received by a decode rank)")
    return 0


def _gpu_memory(args, gpu) -> tuple[int, str]:
    """Bytes per GPU for the largest batch, and where they come from: --gpu-memory GiB, else
    the --gpu's capacity, else 80 GiB."""
    if args.gpu_memory is not None:
        if not args.gpu_memory > 0 or args.gpu_memory == float("inf"):
            raise UsageError(f"--gpu-memory {args.gpu_memory:g}: must be a positive number of GiB (e.g. 80)")
        return int(args.gpu_memory * GiB), "--gpu-memory"
    if gpu is not None and gpu.gpu.memory_gib:
        return int(gpu.gpu.memory_gib * GiB), f"the {gpu.gpu.name}'s"
    return DEFAULT_GPU_MEMORY, "default"


def _print_cache(m: dict, plan: Plan) -> None:
    inf = m["inference"]
    requests = plan.micro_batch_size * plan.micro_batches
    per_rank = max(rc["memory_bytes"]["kv_cache"] for rc in m["rank_classes"])
    state = inf.get("recurrent_state_bytes_per_request", 0)
    state_text = f", {memory_text(state)} of them recurrent state of a fixed size" if state else ""
    print()
    if inf["context_len"] is not None:  # (a model without a sequence (an image model) keeps no cache)
        print(f"KV cache at context {inf['context_len']:,}: {memory_text(inf['kv_cache_bytes_per_request'])} per "
              f"request ({inf['kv_cache_elements_per_token_per_layer']:,} elements per token per layer{state_text}); "
              f"{memory_text(per_rank)} per rank for its {plural(requests, 'request')}")
    most, capacity = inf["largest_batch"], inf["gpu_memory_bytes"]
    source = inf.get("gpu_memory_from", "")
    where = (f"{gib(capacity)} per GPU" + (f" (the default; --gpu NAME or --gpu-memory GiB for yours)"
                                          if source == "default" else f" ({source})" if source else ""))
    weights = max(rc["memory_bytes"]["parameters"] for rc in m["rank_classes"])
    if most == 0:
        print(f"largest batch in {where}: none (the weights take {gib(weights)} per rank)")
    else:
        print(f"largest batch in {where}: {most:,} requests per replica "
              f"({most * plan.dp:,} over dp {plan.dp}), beside {gib(weights)} of weights per rank")


#: what a set without manifest.json leaves unchecked (said in the first line of validate)
NO_MANIFEST = ("no manifest.json: its costs are unchecked (FLOPs, bytes, durations, programs and the groups' ring "
               "order are compared with nothing; only structure, groups, pairs and the replay are checked)")


def cmd_validate(host: PluginHost, args) -> int:
    from .validate import examine

    directory = Path(args.dir)
    trace_set = read_trace_set(host, directory)
    has_manifest = "manifest" in (trace_set.metadata or {})
    generator = str((trace_set.metadata or {}).get("generator") or "")
    require = args.require_manifest
    if require is None:  # by default, a set STAGE wrote must keep its manifest
        require = generator.startswith("stage ")
    if require and not has_manifest:
        why = f"its traces say {generator} wrote it" if generator.startswith("stage ") else "--require-manifest"
        raise TraceError([f"{directory}: {NO_MANIFEST.split(':')[0]} ({why}): without it the set's costs cannot be "
                          f"checked (a kernel made 1,000x longer would pass); write the set again, or give "
                          f"--no-require-manifest to check its structure only"])
    ranks = trace_set.world_size if trace_set.ranks is None else len(trace_set.ranks)
    with progress_of(args).phase("validating", ranks, "ranks") as done:  # (the replay runs after the last rank)
        report = examine(_counted(trace_set, done), rooflines=rooflines(host))
    problems, verdict = report.problems, report.verdict
    if args.json:
        subset = {} if trace_set.ranks is None else {"subset": ranks_text(trace_set.ranks)}
        replay = None if verdict is None else {
            "finishes": verdict.finishes, "unfinished_ranks": list(verdict.unfinished),
            "timing_independent": verdict.timing_independent,
            "processes": verdict.processes, "per_class": verdict.per_class,
            "first_tick": None if verdict.first_tick is None else {
                "ranks": list(verdict.first_tick.ranks), "node": verdict.first_tick.node_id,
                "name": verdict.first_tick.name, "gpus": list(verdict.first_tick.gpus)}}
        print(json.dumps({"dir": str(directory), "ranks": trace_set.world_size, **subset,
                          "valid": not problems,
                          "costs_checked": has_manifest,
                          "problems": [{"rank": p.rank, "node": p.node_id, "name": p.node_name, "reason": p.reason}
                                       for p in problems], "replay": replay}, indent=2))
        return 1 if problems or (verdict is not None and not verdict.finishes) else 0
    if problems:
        if not has_manifest:
            print(one_line(f"{directory}: {NO_MANIFEST}"), file=sys.stderr)
        for p in problems:
            print(one_line(f"{directory}: {p}"), file=sys.stderr)
        if verdict is not None and verdict.blocked not in problems:
            print(one_line(f"{directory}: {_verdict_text(verdict)}"), file=sys.stderr)
        return 1
    if not has_manifest:
        print(one_line(f"{directory}: {NO_MANIFEST}"))
    if trace_set.ranks is not None:
        print(f"{directory}: {len(trace_set.ranks)} of {trace_set.world_size} ranks "
              f"({ranks_text(trace_set.ranks)}), valid")
        return 0
    if verdict.first_tick is not None:  # (sound, but the simulator aborts on it: validate says so, exit 1)
        print(one_line(f"{directory}: {trace_set.world_size} ranks, valid; but {_verdict_text(verdict)}"),
              file=sys.stderr)
        return 1
    print(f"{directory}: {trace_set.world_size} ranks, valid; {_verdict_text(verdict)}")
    return 0


def _verdict_text(verdict) -> str:
    """What the replay of ASTRA-sim's issue rules says the simulator will do."""
    if verdict.unfinished:
        text = (f"{len(verdict.unfinished)} ranks ({ranks_text(verdict.unfinished)}) never "
                f"finish in ASTRA-sim")
    elif verdict.first_tick is not None:
        tick = verdict.first_tick
        return (f"ASTRA-sim aborts at its first tick on the roofline of {', '.join(tick.gpus)}: the first kernel of "
                f"ranks {ranks_text(tick.ranks)}, node {tick.node_id} ({tick.name}, {tick.num_ops:,} FLOPs, "
                f"{tick.tensor_size:,} bytes), takes under 1 ns, and {hardware.TICK_ZERO}; generate the set with "
                f"--gpu NAME (timed kernels last at least 1 ns) or a larger batch")
    else:
        text = "every rank finishes in ASTRA-sim"
    text += f" (replayed as {plural(verdict.processes, 'rank class' if verdict.per_class else 'rank')}"
    if not verdict.timing_independent:
        text += "; for one timing only: some ranks' sends and collectives are not ordered by their dependencies"
    return text + ")"


def cmd_models(host: PluginHost, args) -> int:
    if args.file is not None:
        return _model_file(host, args)
    if args.family is not None:
        raise UsageError(f"--family {args.family}: it reads a config.json FILE as that family; give the FILE too")
    def count(spec, config) -> tuple[int, int]:
        return param_counts(model_graphs(spec, config, Plan())[0])  # (built as plan_job builds it)

    rows = preset_rows(host, count, progress_of(args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no models: install a model plugin (stage-model-gpt, stage-model-llama, stage-model-moe)"
              + host.broken_hint())
        return 0
    for line in table(["model", "family", "parameters", "active", "plugin"],
                      [[r["name"], r["family"], count_text(r["params_total"]), count_text(r["params_active"]),
                        r["plugin"]] for r in rows], left=(0, 1, 4)):
        print(line)
    print("(active: the parameters one token uses; B = 10^9, M = 10^6)")
    return 0


def _model_file(host: PluginHost, args) -> int:
    """``stage models FILE``: how a config.json is read (family, parameters, layers, ignored keys)."""
    if args.family:
        host.hf_family = args.family
    spec, config = resolve_model(host, args.file, _overrides(args.set))
    graph = model_graphs(spec, config, Plan())[0]  # built as plan_job builds it: its kernels in scope, checked
    total, active = param_counts(graph)
    record = hf_import_of(config) or {}
    kinds = layer_kinds(graph)
    if args.json:
        print(json.dumps({"source": record.get("source", args.file), "model_type": record.get("model_type"),
                          "family": spec.family, "plugin": spec.plugin, "name": config.name,
                          "params_total": total, "params_active": active,
                          "layers": sum(kinds.values()), "layers_by_kind": kinds,
                          "ignored_keys": record.get("ignored_keys", []), "model": config.to_dict()}, indent=2))
        return 0
    print(f"{args.file}: model_type {record.get('model_type')!r} read as family {spec.family} ({spec.plugin})")
    print(f"parameters: {total:,} total, {active:,} active per token ({count_text(total)}, {count_text(active)})")
    print(f"layers: {sum(kinds.values())}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.items()))
    ignored = record.get("ignored_keys", [])
    print(f"keys not modelled (ignored): {', '.join(ignored) if ignored else 'none'}")
    return 0


def cmd_plans(host: PluginHost, args) -> int:
    plans = host.plans()
    if args.json:
        print(json.dumps([{"name": p.name, "plugin": p.plugin, "world_size": p.world_size,
                           "settings": dict(p.settings), "flags": p.flags(), "description": p.description,
                           "source": p.source} for p in plans], indent=2))
        return 0
    if not plans:
        print("no plans: install a plugin that registers some (stage-parallel)" + host.broken_hint())
        return 0
    width = max(len(p.name) for p in plans)
    print(f"{'plan':<{width}}  {'GPUs':>6}  flags (apply with --plan NAME; flags given alongside override)")
    for p in plans:
        print(f"{p.name:<{width}}  {p.world_size:>6,}  {' '.join(p.flags())}")
        print(f"{'':<{width}}  {'':>6}  {p.description}" + (f" [{p.source}]" if p.source else ""))
    return 0


def cmd_new_plugin(host: PluginHost, args) -> int:
    target = write_skeleton(args.name, args.kind, args.output)
    print(f"wrote {target}/: a STAGE {args.kind} plugin. Next: pip install -e {target}[test] && pytest {target}; "
          f"docs/plugins.md says what to change")
    return 0


def cmd_plugins(host: PluginHost, args) -> int:
    infos = host.info()
    if args.json:
        print(json.dumps([{"name": i.name, "source": i.source, "version": i.version,
                           "provides": {k: list(v) for k, v in i.provides.items()}, "error": i.error}
                          for i in infos], indent=2))
        return 0
    for i in infos:
        if i.source == "blocked":
            continue
        if i.error:
            print(f"{i.name:<28} FAILED: {i.error}")
            continue
        provides = "; ".join(f"{k}: {', '.join(v)}" for k, v in i.provides.items()) or "-"
        print(f"{i.name:<28} {i.source:<10} {i.version or '':<8} {provides}")
    blocked = [i.name for i in infos if i.source == "blocked"]
    if blocked:
        print(f"blocked by STAGE_DISABLE_PLUGINS: {', '.join(blocked)}")
    return 0


# --------------------------------------------------------------------------- parser and main


def build_parser(host: PluginHost | None) -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Synthesize per-GPU execution traces of distributed LLM training and "
                                            "inference (prefill, decode, disaggregated serving) for ASTRA-sim.")
    parser.add_argument("--version", action="version", version=f"stage {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("generate", help="write one trace per GPU (default: gpt-tiny on 8 GPUs into ./traces)")
    add_plan_flags(p, host)
    add_gpu_flag(p, host, default=DEFAULT_GPU)
    formats = [b.name for b in host.backends()] if host is not None else []
    _host_choice_flag(p, "--format", formats, "chakra", "trace format")
    p.set_defaults(format="chakra")
    p.add_argument("-o", "--output", default="traces", metavar="DIR", help="output folder (default ./traces)")
    p.add_argument("--no-validate", action="store_true", help="skip checking the set before it is moved into place")
    p.add_argument("--ranks", metavar="LIST", help="write only these ranks' traces, e.g. 0-63,4096 "
                                                  "(the manifest names them; stage validate checks them)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes writing the files (default: one per core)")
    add_quiet_flag(p)
    p.set_defaults(run=cmd_generate)

    p = sub.add_parser("report", help="FLOPs, memory and traffic per rank class, without writing traces")
    add_plan_flags(p, host, writes=False)
    add_gpu_flag(p, host, default=DEFAULT_GPU)
    p.add_argument("--json", action="store_true", help="print the manifest's JSON instead of a table")
    p.add_argument("--gpu-memory", type=float, metavar="GiB",
                   help="prefill/decode: memory per GPU in GiB (2^30 bytes) for the largest batch that fits "
                        f"(default: the --gpu's capacity, else {DEFAULT_GPU_MEMORY_GIB} GiB)")
    p.set_defaults(run=cmd_report)

    p = sub.add_parser("validate", help="check a trace set (ids, dependencies, collectives, send/recv)")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--json", action="store_true", help="print the verdict and the problems as JSON")
    p.add_argument("--require-manifest", action=argparse.BooleanOptionalAction, default=None,
                   help="refuse a set without manifest.json, whose costs cannot be checked (default: for a set "
                        "STAGE wrote, as its traces say; --no-require-manifest checks such a set's structure only)")
    add_quiet_flag(p)
    p.set_defaults(run=cmd_validate)

    p = sub.add_parser("models", help="list model presets with their parameter counts, or show how a config.json "
                                      "FILE is read")
    p.add_argument("file", nargs="?", metavar="FILE", help="a Hugging Face config.json: its family, total and "
                                                          "active parameters, layers by kind, ignored keys")
    p.add_argument("--family", metavar="NAME", help="read FILE as this model family")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field or a config.json key of FILE (repeatable)")
    p.add_argument("--json", action="store_true")
    add_quiet_flag(p)
    p.set_defaults(run=cmd_models)

    p = sub.add_parser("plans", help="list named parallel plans (published training setups) for --plan")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_plans)

    p = sub.add_parser("new-plugin", help="write a skeleton plugin distribution that installs and passes its tests")
    p.add_argument("name", metavar="NAME", help="the plugin's name: lowercase words joined by '-' (zero-bubble)")
    p.add_argument("--kind", required=True, choices=KINDS, help="what it provides")
    p.add_argument("-o", "--output", metavar="DIR", help="the folder to write (default ./stage-KIND-NAME)")
    p.set_defaults(run=cmd_new_plugin)

    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_plugins)

    if host is not None:
        for spec in host.commands():
            if spec.name in sub.choices:
                raise PluginError(f"plugin {spec.plugin!r} adds command {spec.name!r}, which exists already")
            p = sub.add_parser(spec.name, help=spec.help)
            p.stage_host = host  # add_plan_flags and add_gpu_flag list the host's schedules, options, presets
            spec.configure(p)
            p.set_defaults(run=lambda h, a, _spec=spec: _spec.run(a))
    return parser


#: characters that would end a line (str.splitlines splits on each), shown escaped
_LINE_BREAKS = {c: repr(chr(c))[1:-1] for c in [*range(32), 0x7F, 0x85, 0x2028, 0x2029]}


def one_line(message: str) -> str:
    """``message`` on one line: a value the user gave (or a damaged file holds) may carry
    line breaks and control characters; they are shown escaped, as ``\\n``."""
    return message.translate(_LINE_BREAKS)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C, so a half-written set is removed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _terminate(signum, frame):
    raise Terminated(signum)


@contextmanager
def _terminate_like_ctrl_c():
    """SIGTERM and SIGHUP raise :class:`Terminated` while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = [n for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    previous = {n: signal.signal(getattr(signal, n), _terminate) for n in names}
    try:
        yield
    finally:
        for n, handler in previous.items():
            signal.signal(getattr(signal, n), handler)


def main(argv: Sequence[str] | None = None, host: PluginHost | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with _terminate_like_ctrl_c():
        return _main(argv, host)


def _main(argv: list[str], host: PluginHost | None) -> int:
    try:
        if host is None:
            host = PluginHost()
        parser = build_parser(host)
        if not argv:
            parser.print_help()
            return 0
        args = parser.parse_args(argv)
        if getattr(args, "run", None) is None:
            parser.print_help()
            return 0
        args.stage_host = host  # plugin commands read the host from their args
        return int(args.run(host, args) or 0)
    except TraceError as exc:
        for problem in exc.problems:
            print(one_line(f"{PROG}: invalid trace: {problem}"), file=sys.stderr)
        return exc.exit_status
    except StageError as exc:
        print(one_line(f"{PROG}: error: {exc}"), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Terminated) else signal.SIGINT
        print(f"{PROG}: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:  # the reader went away (``stage models | head``)
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
