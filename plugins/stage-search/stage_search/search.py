"""``stage search``: the best plans for a model on a cluster.

1. Enumerate the plans (:mod:`.space`), each checked by the core and the strategies.
2. Measure each layer key once (:mod:`.probe`) and drop the plans that do not fit in
   the GPU's memory, counting why.
3. Rank the rest by the fast estimate (:mod:`.fast`).
4. Estimate the best ``--candidates`` again with the replay of ``stage estimate`` (every
   node of every micro-batch) and rank them by it: the step times the table shows.
5. Run the best ``--top`` in a simulator of the ``stage_simulators`` hook (ASTRA-sim),
   when one is installed and the set is small enough to simulate here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stage_core.api import (MAX_WORLD, GiB, Plan, PluginHost, Progress, UsageError, add_quiet_flag, check_output_file,
                            hardware, plan_from_settings, plan_job, resolve_model, scratch_folder, table,
                            write_figure)

from . import probe
from .estimate import estimate_job
from .fast import estimate_plans
from .space import Constraints, balanced, enumerate_decode, enumerate_plans

HELP = "the best parallel plans for a model on N GPUs: enumerated, estimated, the best simulated"
DEFAULT_GPU = "h100"
#: the largest set (nodes, all ranks) simulated by default
#: what ASTRA-sim's analytical backend does here: 785,216 nodes of 64 ranks in 29 s, 1.08 M
#: nodes of 128 ranks in 473 s on a loaded machine, and a 1,024-rank GPT-3 175B set of
#: 12 M nodes held 16.7 GB after 11 minutes unfinished: a million nodes is seconds to minutes
SIMULATE_MAX_NODES = 1_000_000


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a preset name (see `stage models`) or a Hugging Face config.json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a model config field")
    p.add_argument("--gpus", type=int, required=True, metavar="N", help="GPUs in the cluster (the world size)")
    p.add_argument("--gpu", default=None, metavar="NAME|FILE", help=f"hardware preset or file (default {DEFAULT_GPU})")
    p.add_argument("--gpu-memory", type=float, metavar="GiB",
                   help="memory per GPU in GiB (2^30 bytes), what a plan must fit in (default: the GPU's capacity)")
    p.add_argument("--global-batch", type=int, metavar="B",
                   help="sequences per step (default: a published plan's for this model and GPU count, else N)")
    p.add_argument("--seq-len", type=int, metavar="S", help="tokens per sequence (default: the model's)")
    p.add_argument("--task", choices=("train", "decode"), default="train",
                   help="what the plans run: train (--global-batch sequences of --seq-len tokens) or decode "
                        "(one new token for each of --global-batch requests attending to --seq-len tokens; every "
                        "plan estimated by the replay)")
    g = p.add_argument_group("constraints (narrow the space)")
    for name in ("tp", "cp", "pp", "ep"):
        g.add_argument(f"--{name}", type=int, metavar="N", help=f"only plans with this {name} degree")
    g.add_argument("--max-pp", type=int, metavar="N", help="pipeline stages at most")
    g.add_argument("--micro-batch-size", type=int, metavar="b", help="only this micro-batch size")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="only this ZeRO stage")
    g.add_argument("--recompute", choices=("none", "selective", "full"), help="only this recompute")
    g = p.add_argument_group("output")
    g.add_argument("--top", type=int, default=5, metavar="K", help="plans shown and simulated (default 5)")
    g.add_argument("--candidates", type=int, default=None, metavar="N",
                   help="plans estimated again with the full replay (default max(10, 2 x top))")
    g.add_argument("--compare", metavar="PLAN", help="also rank a named plan (see `stage plans`)")
    g.add_argument("--no-simulate", action="store_true", help="do not run the simulator")
    g.add_argument("--simulator", default="astrasim",
                   help="simulator of the stage_simulators hook: astrasim (analytical), astrasim-aware, "
                        "astrasim-htsim (default astrasim)")
    g.add_argument("--astra-sim", dest="astra_sim", metavar="BIN",
                   help="the simulator's binary (default: its environment variable, $ASTRA_SIM_BIN for astrasim, "
                        "else its name on PATH; without one the best plans are estimated only)")
    g.add_argument("--simulate-max-nodes", type=int, default=SIMULATE_MAX_NODES, metavar="N",
                   help=f"simulate a set of at most N nodes, all ranks (default {SIMULATE_MAX_NODES:,}: "
                        "seconds to minutes in ASTRA-sim's analytical backend)")
    g.add_argument("--json", action="store_true", help="print the full table as JSON")
    g.add_argument("--plot", metavar="FILE.png", help="every plan that fits: step time (log scale) against memory per "
                                                      "GPU, the Pareto front, the best --top plans and the --compare "
                                                      "plan labelled (pip install 'stage-search[plot]')")
    g.add_argument("--force", action="store_true", help="replace the --plot file even if STAGE did not write it")
    add_quiet_flag(p)


@dataclass
class Entry:
    plan: Plan
    fast_s: float
    memory_bytes: int
    mfu: float
    exposed_comm_s: float
    step_time_s: float | None = None  # the replay's (stage estimate), for candidates
    simulated_s: float | None = None
    hardware_tflops: float | None = None  # every matmul, recompute included, per GPU (the replayed candidates)
    notes: list[str] = field(default_factory=list)

    @property
    def best_s(self) -> float:
        return self.step_time_s if self.step_time_s is not None else self.fast_s

    def to_dict(self) -> dict:
        return {"plan": plan_flags(self.plan), "step_time_s": self.best_s,
                "estimator": "replay" if self.step_time_s is not None else "fast",
                "fast_step_time_s": self.fast_s, "simulated_step_time_s": self.simulated_s,
                "mfu": self.mfu, "hardware_tflops_per_gpu": self.hardware_tflops,
                "memory_bytes": int(self.memory_bytes), "exposed_comm_s": self.exposed_comm_s}


def plan_flags(plan: Plan) -> list[str]:
    """The ``stage generate`` flags of ``plan`` (defaults left out)."""
    base = Plan()
    out: list[str] = []
    for name, flag in (("tp", "--tp"), ("cp", "--cp"), ("ep", "--ep"), ("pp", "--pp"), ("dp", "--dp")):
        value = getattr(plan, name)
        if value != 1 or name in ("tp", "pp", "dp"):
            out += [flag, str(value)]
    if plan.sp:
        out.append("--sp")
    train = plan.task == "train"
    for name, flag in (("zero", "--zero"), ("recompute", "--recompute"), ("schedule", "--schedule"),
                       ("virtual_stages", "--virtual-stages"), ("cp_comm", "--cp-comm"), ("order", "--order")):
        if getattr(plan, name) != getattr(base, name) or (train and name in ("zero", "recompute", "schedule")):
            out += [flag, str(getattr(plan, name))]
    if plan.stage_layers is not None:
        out += ["--stage-layers", plan.stage_layers if isinstance(plan.stage_layers, str)
                else ",".join(map(str, plan.stage_layers))]
    out += ["--micro-batch-size", str(plan.micro_batch_size), "--micro-batches", str(plan.micro_batches)]
    if train:
        return out + ["--seq-len", str(plan.seq_len)]
    return out + ["--task", plan.task, "--context-len", str(plan.context_len)]


def plan_text(plan: Plan) -> str:
    parts = [f"tp{plan.tp}"] + [f"{a}{getattr(plan, a)}" for a in ("cp", "ep") if getattr(plan, a) > 1]
    parts += [f"pp{plan.pp}", f"dp{plan.dp}"]
    if plan.virtual_stages > 1:
        parts.append(f"v{plan.virtual_stages}")
    if plan.task != "train":
        parts += [f"{plan.micro_batches}x{plan.micro_batch_size} requests"]
        return " ".join(parts)
    parts += [f"mbs{plan.micro_batch_size}", f"z{plan.zero}", {"none": "-", "selective": "rc-sel",
                                                             "full": "rc-full"}[plan.recompute]]
    if plan.schedule == "gpipe":
        parts.append("gpipe")
    if plan.order != Plan().order:
        parts.append(plan.order)
    return " ".join(p for p in parts if p != "-")


def run(args: argparse.Namespace) -> int:
    host = getattr(args, "stage_host", None) or PluginHost()
    result = search(host, args, err=sys.stderr)
    if args.json:
        print(json.dumps(result["json"], indent=1))
    else:
        print(result["text"])
    if args.plot:
        compare = result.get("compare")
        plot(result["entries"], Path(args.plot), result["title"], force=args.force, top=args.top, compare=compare,
             compare_name=result.get("compare_name"), capacity=result.get("capacity"),
             rank_of_compare=_rank(result["entries"], compare) if compare is not None else None)
    return 0


#: flags that count something: given, each must be 1 or more (0 is never "the default")
_COUNTS = ("gpus", "global_batch", "seq_len", "tp", "cp", "pp", "ep", "max_pp", "micro_batch_size", "top",
           "candidates", "simulate_max_nodes")


def check_arguments(args) -> None:
    """Refuse, before any work, a flag given a value that means nothing: a count of 0 or
    less, a memory size that is not a positive finite number, more GPUs than STAGE lays out."""
    for name in _COUNTS:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} {value}: must be 1 or more")
    if args.gpus > MAX_WORLD:
        raise UsageError(f"--gpus {args.gpus:,}: above the {MAX_WORLD:,} ranks STAGE lays out")
    if args.gpu_memory is not None and not 0 < args.gpu_memory < math.inf:
        raise UsageError(f"--gpu-memory {args.gpu_memory:g}: must be a positive number of GiB (e.g. 80)")


def search(host: PluginHost, args, err=None) -> dict:
    err = err or sys.stderr
    say = (lambda text: print(text, file=err, flush=True))
    t0 = time.perf_counter()
    check_arguments(args)
    check_simulator_binary(host, args)
    if args.plot:
        _check_plot()
        check_output_file(args.plot, "--plot", force=getattr(args, "force", False))  # before the work
    overrides = _overrides(args.set)
    spec, config = resolve_model(host, args.model, overrides)
    reference = _reference(host, args)
    gpu_name = args.gpu or (reference.gpu if reference and reference.gpu else None) or DEFAULT_GPU
    hw = hardware.resolve(host, gpu_name)
    capacity = int(args.gpu_memory * GiB) if args.gpu_memory is not None else int(hw.gpu.memory_gib * GiB)
    if capacity <= 0:
        raise UsageError(f"--gpu {hw.name} gives no memory size; give --gpu-memory GiB")
    progress = Progress.for_args(args)
    seq = args.seq_len if args.seq_len is not None else getattr(config, "seq_len", None)
    if not seq:
        raise UsageError(f"model {config.name} has no default sequence length; give --seq-len")
    batch = args.global_batch
    if batch is None:
        batch = _default_batch(host, config.name, args.gpus) or args.gpus
    forward = spec.build(config)
    if not probe.uniform_layers(forward):
        raise UsageError(f"--model {args.model}: stage search measures one kind of layer; {config.name}'s layers "
                         f"differ (estimate its plans one by one with stage estimate)")
    layers = len({op.layer for op in forward.ops if op.layer is not None})
    experts = int(forward.dims.get("E", 0)) if any(op.attrs.get("moe") for op in forward.ops) else 0
    strategies = sorted(host.strategies(), key=lambda s: (s.order, s.name))

    def validate(plan: Plan) -> list[str]:
        problems: list[str] = []
        for s in strategies:
            problems += list(s.validate(forward, plan))
        return problems

    constraints = Constraints(tp=args.tp, cp=args.cp, pp=args.pp, ep=args.ep, max_pp=args.max_pp,
                              micro_batch_size=args.micro_batch_size, zero=args.zero, recompute=args.recompute)
    if args.task == "decode":
        return _search_decode(host, args, overrides, config, hw, capacity, seq, batch, layers, experts, constraints,
                              validate, say, t0, progress)
    with progress.phase("enumerating plans"):
        space = enumerate_plans(args.gpus, batch, seq, layers, gpus_per_node=hw.gpus_per_node, experts=experts,
                                constraints=constraints, validate=validate)
    t_enum = time.perf_counter()
    say(f"{config.name} on {args.gpus:,} x {hw.name} ({capacity / 2**30:,.0f} GiB each), global batch {batch} x "
        f"{seq} tokens: {space.enumerated:,} plans enumerated, {len(space.plans):,} valid "
        f"({t_enum - t0:.1f} s)")
    for reason, count in sorted(space.refused.items(), key=lambda kv: -kv[1]):
        say(f"  {count:,} refused: {reason}")
    plans = space.plans
    if reference is not None:
        plans = plans + [reference.plan]
    if not plans:
        raise UsageError("no valid plan: loosen the constraints (see the reasons above)")
    orders = {s.name: s.order for s in host.schedules()}
    costs, memory = _measure(host, args.model, overrides, plans, hw, layers, orders, capacity, progress)
    t_probe = time.perf_counter()
    say(f"measured {len(costs)} layer keys in {t_probe - t_enum:.1f} s")
    fitting = [i for i, p in enumerate(plans) if memory[i] <= capacity or (reference and p is reference.plan)]
    with progress.phase(f"estimating {len(fitting):,} plans"):
        fast = estimate_plans([plans[i] for i in fitting], costs, layers, hw, orders.__getitem__)
    t_fast = time.perf_counter()
    peak = hw.gpu.peak_flops("bf16")
    entries = [Entry(p, np.inf, int(memory[i]), 0.0, 0.0) for i, p in enumerate(plans)]
    for j, i in enumerate(fitting):
        e = entries[i]
        e.fast_s = float(fast.step_ns[j]) * 1e-9
        e.mfu = float(fast.model_flops[j]) / e.fast_s / peak
        e.exposed_comm_s = float(fast.exposed_comm_ns[j]) * 1e-9
    ref_entry = entries.pop() if reference is not None else None
    say(f"estimated {len(fitting):,} plans in {t_fast - t_probe:.2f} s "
        f"({len(entries) / max(t_fast - t0, 1e-9):,.0f} plans/s from enumeration on)")
    fits = [e for e in entries if e.memory_bytes <= capacity]
    over = len(entries) - len(fits)
    if over:
        need = min(e.memory_bytes for e in entries if e.memory_bytes > capacity)
        say(f"  {over:,} do not fit in {capacity / 2**30:,.0f} GiB per GPU (parameters, gradients, optimizer state "
            f"and activations in flight; the smallest of them needs {need / 2**30:,.1f} GiB)")
    if not fits:
        raise UsageError(f"no plan fits in {capacity / 2**30:,.0f} GiB per GPU; raise --gpus or --gpu-memory")
    fits.sort(key=lambda e: e.fast_s)
    count = max(args.candidates or max(10, 2 * args.top), args.top)
    candidates = fits[:count]
    if ref_entry is not None:
        candidates = candidates + [ref_entry]
    for e in progress.iterate(candidates, "replaying the best plans", "plans"):
        result = plan_job(host, args.model, overrides, e.plan, hw)
        est = estimate_job(result.job, hw)
        e.step_time_s = est.step_time_s
        classes = result.manifest["rank_classes"]
        model = sum(rc["flops"]["model"] * len(rc["ranks"]) for rc in classes) / result.job.world_size
        e.mfu = model / est.step_time_s / peak
        matmul = sum(rc["flops"]["matmul"] * len(rc["ranks"]) for rc in classes) / result.job.world_size
        e.hardware_tflops = matmul / est.step_time_s / 1e12
        e.memory_bytes = max(rc["memory_bytes"]["total"] for rc in classes)
        busiest = max(range(len(est.classes)), key=lambda i: est.classes[i].compute_ns)
        e.exposed_comm_s = est.classes[busiest].exposed_comm_ns * 1e-9
    t_acc = time.perf_counter()
    say(f"estimated the best {min(count, len(fits))} again with the replay in {t_acc - t_fast:.1f} s")
    ranked = sorted(fits[:count], key=lambda e: e.step_time_s) + fits[count:]
    top = ranked[:args.top]
    simulated = _simulate(host, args, top + ([ref_entry] if ref_entry else []), hw, say, progress)
    title = (f"{config.name} on {args.gpus:,} {hw.name}, global batch {batch} x {seq} (kernels timed by the "
             f"{hw.gpu.compute_model} compute model)")
    text = _table(top, ref_entry, ranked, title, simulated)
    data = {"model": config.name, "gpus": args.gpus, "gpu": hw.name, "gpu_memory_bytes": capacity,
            "global_batch": batch, "seq_len": seq, "enumerated": space.enumerated, "valid": len(space.plans),
            "refused": space.refused, "do_not_fit": over, "layer_keys": len(costs),
            "seconds": {"enumerate": t_enum - t0, "measure_layers": t_probe - t_enum, "fast": t_fast - t_probe,
                        "replay": t_acc - t_fast},
            "simulator": simulated, "plans": [e.to_dict() for e in ranked]}
    if ref_entry is not None:
        data["compare"] = {"name": reference.name, "rank": _rank(ranked, ref_entry), **ref_entry.to_dict()}
    return {"json": data, "text": text, "entries": ranked, "title": title, "compare": ref_entry,
            "compare_name": reference.name if reference else None, "capacity": capacity}


def _search_decode(host, args, overrides, config, hw, capacity, context, requests, layers, experts, constraints,
                   validate, say, t0, progress) -> dict:
    """Decode: few plans, each estimated by the replay (no layer measurement)."""
    if args.compare:
        raise UsageError("--compare ranks a named training plan; it needs --task train")
    space = enumerate_decode(args.gpus, requests, context, layers, gpus_per_node=hw.gpus_per_node, experts=experts,
                             constraints=constraints, validate=validate)
    say(f"{config.name} decoding {requests} requests of {context} tokens on {args.gpus:,} x {hw.name}: "
        f"{space.enumerated:,} plans enumerated, {len(space.plans):,} valid")
    for reason, count in sorted(space.refused.items(), key=lambda kv: -kv[1]):
        say(f"  {count:,} refused: {reason}")
    peak = hw.gpu.peak_flops("bf16")
    entries, over = [], 0
    for plan in progress.iterate(space.plans, "estimating plans with the replay", "plans"):
        result = plan_job(host, args.model, overrides, plan, hw)
        classes = result.manifest["rank_classes"]
        memory = max(rc["memory_bytes"]["total"] for rc in classes)
        if memory > capacity:
            over += 1
            continue
        est = estimate_job(result.job, hw)
        model = sum(rc["flops"]["model"] * len(rc["ranks"]) for rc in classes) / result.job.world_size
        busiest = max(range(len(est.classes)), key=lambda i: est.classes[i].compute_ns)
        e = Entry(plan, est.step_time_s, memory, model / est.step_time_s / peak,
                  est.classes[busiest].exposed_comm_ns * 1e-9, step_time_s=est.step_time_s)
        entries.append(e)
    t_est = time.perf_counter()
    say(f"estimated {len(space.plans):,} plans with the replay in {t_est - t0:.1f} s"
        + (f"; {over:,} do not fit in {capacity / 2**30:,.0f} GiB per GPU (weights, KV cache and working set)"
           if over else ""))
    if not entries:
        raise UsageError(f"no plan fits in {capacity / 2**30:,.0f} GiB per GPU; raise --gpus or --gpu-memory, "
                         f"or lower --global-batch")
    ranked = sorted(entries, key=lambda e: e.step_time_s)
    top = ranked[:args.top]
    simulated = _simulate(host, args, top, hw, say, progress)
    title = (f"{config.name} decoding on {args.gpus:,} {hw.name}: {requests} requests x {context} tokens of context "
             f"(step: one new token for every request)")
    data = {"model": config.name, "task": "decode", "gpus": args.gpus, "gpu": hw.name, "gpu_memory_bytes": capacity,
            "requests": requests, "context_len": context, "enumerated": space.enumerated, "valid": len(space.plans),
            "refused": space.refused, "do_not_fit": over, "simulator": simulated,
            "plans": [{**e.to_dict(), "tokens_per_s": requests / e.step_time_s} for e in ranked]}
    return {"json": data, "text": _table(top, None, ranked, title, simulated), "entries": ranked, "title": title,
            "capacity": capacity}


@dataclass
class _Reference:
    name: str
    plan: Plan
    gpu: str | None


def _reference(host, args) -> _Reference | None:
    if not args.compare:
        return None
    spec = host.plan(args.compare)
    req = plan_from_settings({"plan": spec.name}, host)
    plan = req.plan
    if plan.world_size != args.gpus:
        raise UsageError(f"--compare {args.compare}: runs on {plan.world_size:,} GPUs, not --gpus {args.gpus:,}")
    if plan.stage_layers == "auto":  # the split the pp strategy makes, for the fast estimate
        _, config = resolve_model(host, spec.settings.get("model", args.model), {})
        plan = plan.replace(stage_layers=balanced(config.layers, plan.pp * plan.virtual_stages))
    return _Reference(spec.name, plan, req.gpu)


def _rank(ranked: list[Entry], entry: Entry) -> int:
    """1 + the plans ahead of ``entry``: by the replay among the candidates, else by the fast estimate."""
    if entry.step_time_s is not None:
        ahead = sum(1 for e in ranked if e.step_time_s is not None and e.step_time_s < entry.step_time_s)
        ahead += sum(1 for e in ranked if e.step_time_s is None and e.fast_s < entry.fast_s)
        return 1 + ahead
    return 1 + sum(1 for e in ranked if e.best_s < entry.fast_s)


def _measure(host, model, overrides, plans, hw, layers, orders, capacity, progress=None):
    """The measured layer of every layer key the plans that fit need, and every plan's memory.

    Activations grow exactly with the micro-batch size and nothing else in memory does, so
    each layer key is first measured at its smallest micro-batch size; a larger one is
    measured only when some plan of it fits (:func:`.probe.scaled`)."""
    keys: dict[tuple, Plan] = {}
    for p in plans:
        keys.setdefault(probe.layer_key(p), p)
    mbs = probe.KEY_FIELDS.index("micro_batch_size")

    def base(key):
        return key[:mbs] + key[mbs + 1:]

    smallest: dict[tuple, tuple] = {}
    for key in keys:
        if base(key) not in smallest or key[mbs] < smallest[base(key)][mbs]:
            smallest[base(key)] = key
    progress = progress or Progress("off")
    costs = {k: probe.measure(host, model, overrides, keys[k], hw)
             for k in progress.iterate(list(smallest.values()), "measuring layer keys", "keys")}
    for_memory = {k: costs[k] if k in costs else probe.scaled(costs[smallest[base(k)]],
                                                               k[mbs] // smallest[base(k)][mbs])
                  for k in keys}
    memory = estimate_plans(plans, for_memory, layers, hw, orders.__getitem__, times=False).memory
    more: dict[tuple, Plan] = {}
    for i, p in enumerate(plans):
        key = probe.layer_key(p)
        if key not in costs and memory[i] <= capacity:
            more.setdefault(key, p)
    for key in progress.iterate(list(more), "measuring the larger micro-batches", "keys"):
        costs[key] = probe.measure(host, model, overrides, more[key], hw)
    return costs, memory


def check_simulator_binary(host, args) -> None:
    """``--astra-sim BIN``, checked before any work: a simulator must run (not with
    --no-simulate), one that reads a binary (its record's ``binary_env``), from a file that
    can be run."""
    binary = getattr(args, "astra_sim", None)
    if binary is None:
        return
    if args.no_simulate:
        raise UsageError(f"--astra-sim {binary}: names the simulator's binary, and --no-simulate runs none")
    sim = host.simulator(args.simulator)
    if sim.binary_env is None:
        raise UsageError(f"--astra-sim {binary}: the {sim.name} simulator reads no binary (choose --simulator "
                         "astrasim, astrasim-aware or astrasim-htsim)")
    path = Path(binary).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        why = "is not executable" if path.is_file() else "not found"
        raise UsageError(f"--astra-sim {binary} {why}: give the path of the {sim.name} simulator's binary")


@contextmanager
def _binary(sim, binary: str | None):
    """The simulator reads ``binary`` (``--astra-sim``) while the block runs."""
    if binary is None or sim.binary_env is None:
        yield
        return
    before = os.environ.get(sim.binary_env)
    os.environ[sim.binary_env] = str(Path(binary).expanduser().resolve())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(sim.binary_env, None)
        else:
            os.environ[sim.binary_env] = before


def _simulate(host, args, entries: list[Entry], hw, say, progress=None) -> dict:
    if args.no_simulate:
        return {"ran": False, "why": "--no-simulate"}
    try:
        sim = host.simulator(args.simulator)
    except UsageError as exc:
        say(f"not simulated: {exc}; showing estimates only")
        return {"ran": False, "why": str(exc)}
    with _binary(sim, getattr(args, "astra_sim", None)):
        return _simulate_with(host, args, entries, hw, say, progress, sim)


def _simulate_with(host, args, entries: list[Entry], hw, say, progress, sim) -> dict:
    reason = sim.available()
    if reason:
        say(f"not simulated: {sim.name} cannot run here ({reason}); showing estimates only")
        return {"ran": False, "why": reason}
    for e in (progress or Progress("off")).iterate(entries, f"simulating in {sim.name}", "plans"):
        nodes = _set_nodes(host, args, e.plan, hw)
        if nodes > args.simulate_max_nodes:
            e.notes.append(f"not simulated: {nodes:,} nodes > --simulate-max-nodes {args.simulate_max_nodes:,}")
            continue
        with scratch_folder("search") as tmp:  # (a killed search's folder goes at the next one)
            from stage_core.api import write_trace_set

            result = plan_job(host, args.model, _overrides(args.set), e.plan, hw)
            write_trace_set(host, result, tmp / "set")
            started = time.perf_counter()
            got = sim.simulate(tmp / "set", hw)
            if got.get("finished"):
                e.simulated_s = float(got["step_time_s"])
                say(f"  simulated {plan_text(e.plan)}: {e.simulated_s * 1e3:,.1f} ms "
                    f"({time.perf_counter() - started:.0f} s)")
            else:
                e.notes.append("the simulator did not finish every rank")
    return {"ran": True, "simulator": sim.name}


def _set_nodes(host, args, plan: Plan, hw) -> int:
    result = plan_job(host, args.model, _overrides(args.set), plan, None, programs=False)
    return sum(r.nodes * len(r.ranks) for r in result.reports)


def _table(top: list[Entry], ref: Entry | None, ranked: list[Entry], title: str, simulated: dict) -> str:
    def row(rank, e: Entry, mark: str = "") -> list[str]:
        sim = _cell(e.simulated_s * 1e3) if e.simulated_s is not None else "-"
        hw = _cell(e.hardware_tflops) if e.hardware_tflops is not None else "-"
        return [str(rank), plan_text(e.plan), _cell(e.best_s * 1e3), sim, f"{100 * e.mfu:.1f}%", hw,
                _cell(e.memory_bytes / GiB), _cell(e.exposed_comm_s * 1e3), mark]

    rows = [row(i, e) for i, e in enumerate(top, 1)]
    if ref is not None:
        rows.append(row(_rank(ranked, ref), ref, "<- --compare"))
    headers = ["#", "plan", "step ms", "simulated ms", "MFU", "hw TFLOP/s", "memory GiB", "exposed comm ms", ""]
    lines = [title, "", *table(headers, rows, left=2)]
    lines.append("")
    lines.append("step ms: the replay of every node (stage estimate); simulated: ASTRA-sim's step; hw TFLOP/s: "
                 "every matmul, recompute included, per GPU"
                 + ("" if simulated.get("ran") else f" (not run: {simulated.get('why')})"))
    for e in top + ([ref] if ref else []):
        for note in e.notes:
            lines.append(f"  {plan_text(e.plan)}: {note}")
    return "\n".join(lines)


def _cell(x: float) -> str:
    """One decimal from 100 up, else three significant digits (a tiny model's 0.412 ms)."""
    return f"{x:,.1f}" if abs(x) >= 100 or x == 0 else f"{x:.3g}"


def _overrides(pairs) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {pair}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _default_batch(host, model: str, gpus: int) -> int | None:
    """The global batch of a registered plan of ``model`` (one on ``gpus`` GPUs first)."""
    found = [p for p in host.plans() if p.settings.get("model") == model and "global-batch" in p.settings]
    found.sort(key=lambda p: (p.world_size != gpus if hasattr(p, "world_size") else True, p.name))
    return int(found[0].settings["global-batch"]) if found else None


def _check_plot() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib, an optional extra: pip install 'stage-search[plot]'") from None


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (smaller is better)."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def plot(entries: list[Entry], path: Path, title: str, force: bool = False, *, top: int = 5,
         compare: Entry | None = None, compare_name: str | None = None, capacity: int | None = None,
         rank_of_compare: int | None = None) -> None:
    """Every plan that fits: step time (log scale) against memory per GPU; the Pareto front
    (no plan both faster and smaller), the best ``top`` numbered and listed under the plot,
    the ``compare`` plan marked, the GPU's capacity drawn.  The step axis stops at
    :data:`PLOT_SPAN` times the best step (or above the compared plan), so the competitive
    plans spread out; the plans above it are counted in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not entries:
        raise UsageError("--plot: no plan fits, so there is nothing to plot")
    best = min(e.best_s for e in entries)
    ceiling = max(PLOT_SPAN * best, 1.25 * compare.best_s if compare is not None else 0)
    shown = [e for e in entries if e.best_s <= ceiling]
    hidden = len(entries) - len(shown)
    memory = [e.memory_bytes / GiB for e in shown]
    step = [e.best_s for e in shown]
    replayed = [i for i, e in enumerate(shown) if e.step_time_s is not None]
    fast = [i for i, e in enumerate(shown) if e.step_time_s is None]
    front = pareto([(e.memory_bytes / GiB, e.best_s) for e in entries])
    front = [entries[i] for i in front if entries[i].best_s <= ceiling]
    lines = []
    for rank, e in enumerate(entries[:top], 1):
        lines.append(f"#{rank:<3} {plan_text(e.plan):<40} {e.best_s * 1e3:>10,.0f} ms {e.memory_bytes / GiB:>7,.1f} GiB")
    if compare is not None:
        where = f"#{rank_of_compare}" if rank_of_compare else "--compare"
        lines.append(f"{where:<4} {plan_text(compare.plan):<40} {compare.best_s * 1e3:>10,.0f} ms "
                     f"{compare.memory_bytes / GiB:>7,.1f} GiB  <- --compare {compare_name or ''}".rstrip())
    height = 6.0 + 0.14 * len(lines)  # inches: the plot, and the list of the best plans under it
    bottom = 0.14 * len(lines) + 0.15 + 0.6  # the list, a gap, the x axis's labels
    fig = plt.figure(figsize=(10, height))
    ax = fig.add_axes((0.08, bottom / height, 0.9, (height - bottom - 0.45) / height))
    ax.set_yscale("log")
    ax.scatter([memory[i] for i in fast], [step[i] for i in fast], s=8, c="0.6", alpha=0.5, linewidths=0,
               label=f"{len(fast):,} plans (fast estimate)")
    ax.scatter([memory[i] for i in replayed], [step[i] for i in replayed], s=24, c="tab:blue", alpha=0.85,
               label=f"{len(replayed):,} best plans estimated again (replay)")
    ax.step([e.memory_bytes / GiB for e in front], [e.best_s for e in front], "-", where="post", c="tab:red",
            lw=1.2, label="Pareto front: no plan is both faster and smaller")
    ax.scatter([e.memory_bytes / GiB for e in front], [e.best_s for e in front], s=14, c="tab:red", zorder=3)
    groups: list[list[int]] = []  # the best plans that lie on one spot (3% of step, 1 GiB) share a label
    for rank, e in enumerate(entries[:top], 1):
        near = next((g for g in groups if abs(entries[g[0] - 1].memory_bytes - e.memory_bytes) <= GiB
                     and abs(math.log(entries[g[0] - 1].best_s / e.best_s)) <= 0.03), None)
        if near is None:
            groups.append([rank])
        else:
            near.append(rank)
    for ranks in groups:
        e = entries[ranks[0] - 1]
        x, y = e.memory_bytes / GiB, e.best_s
        ax.scatter([x], [y], s=110, facecolors="none", edgecolors="black", lw=1.3, zorder=4)
        text = f"#{ranks[0]}" if len(ranks) == 1 else f"#{ranks[0]}-{ranks[-1]}" if ranks == list(
            range(ranks[0], ranks[-1] + 1)) else "#" + ",".join(map(str, ranks))
        ax.annotate(text, (x, y), xytext=(-8, 8), textcoords="offset points", ha="right", fontsize=9,
                    weight="bold")
    if compare is not None:
        x, y = compare.memory_bytes / GiB, compare.best_s
        label = f"{compare_name or 'compared plan'}" + (f" (#{rank_of_compare})" if rank_of_compare else "")
        ax.scatter([x], [y], s=200, marker="*", c="tab:orange", edgecolors="black", zorder=5,
                   label=f"--compare {label}")
        ax.annotate(label, (x, y), xytext=(10, 4), textcoords="offset points", fontsize=9, color="tab:orange",
                    weight="bold")
    if capacity:
        ax.axvline(capacity / GiB, ls="--", c="0.3", lw=1, label=f"GPU memory ({capacity / GiB:,.0f} GiB)")
    if hidden:
        ax.plot([], [], " ", label=f"{hidden:,} slower plans above {ceiling:,.3g} s not shown")
    ax.set_ylim(best / 1.15, ceiling * 1.05)
    from matplotlib.ticker import FuncFormatter, LogLocator

    plain = FuncFormatter(lambda v, _: f"{v:,.3g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_locator(LogLocator(subs=(2, 3, 5)))
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("memory per GPU (GiB, the busiest stage)")
    ax.set_ylabel("step time (s, log scale)")
    ax.grid(True, which="both", axis="y", alpha=0.3)
    ax.grid(True, which="major", axis="x", alpha=0.2)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    if lines:
        fig.text(0.08, 0.1 / height, "\n".join(lines), fontsize=8, family="monospace", va="bottom", ha="left")
    write_figure(path, fig, "--plot", force=force)


#: the step axis of --plot spans this many times the best plan's step (log scale)
PLOT_SPAN = 4.0
