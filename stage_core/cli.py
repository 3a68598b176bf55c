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

from . import __version__
from .api import DEFAULT_MODEL, DEFAULT_PLAN, check_output_dir, plan_job, read_trace_set, write_trace_set
from .errors import PluginError, StageError, TraceError, UsageError
from .models import param_counts
from .parallel.plan import DEFAULT_ORDER, RECOMPUTE, Plan, parse_stage_layers
from .plugins import PluginHost

PROG = "stage"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse's API
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _add_plan_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", help=f"a preset name (see `stage models`) or a Hugging Face config.json "
                                   f"(default: {DEFAULT_MODEL})")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the model config (repeatable)")
    g = p.add_argument_group("parallel plan")
    for axis, text in (("dp", "data parallel"), ("tp", "tensor parallel"), ("pp", "pipeline parallel"),
                       ("cp", "context parallel"), ("ep", "expert parallel (carved out of dp x cp)")):
        g.add_argument(f"--{axis}", type=int, default=None, metavar="N", help=f"{text} degree (default 1)")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, default=False,
                   help="Megatron sequence parallel (with --tp)")
    g.add_argument("--zero", type=int, default=0, metavar="0|1|2|3", help="ZeRO stage (3 = FSDP); default 0")
    g.add_argument("--recompute", default="none", metavar="|".join(RECOMPUTE),
                   help="activation recompute; default none")
    g.add_argument("--schedule", default="1f1b", metavar="gpipe|1f1b|interleaved", help="pipeline schedule")
    g.add_argument("--virtual-stages", type=int, default=1, metavar="V", help="virtual stages per pipeline rank")
    g.add_argument("--stage-layers", default=None, metavar="auto|N,N,...",
                   help="layers per pipeline stage (pp x virtual-stages counts, in order), or auto: balanced by "
                        "compute, the embedding and the LM head counted as one layer each (default: an even split)")
    g.add_argument("--grad-dtype", default="bf16", metavar="bf16|fp32",
                   help="gradient buffers and their reduction (default bf16; Megatron keeps fp32 main grads)")
    g.add_argument("--optimizer-dtype", default="fp32", metavar="fp32|bf16",
                   help="master weights, momentum and variance (default fp32)")
    g = p.add_argument_group("batch")
    g.add_argument("--seq-len", type=int, default=None, metavar="S", help="tokens per sequence (default: the model's)")
    g.add_argument("--micro-batch-size", type=int, default=1, metavar="b", help="sequences per micro-batch (default 1)")
    g.add_argument("--micro-batches", type=int, default=None, metavar="m",
                   help="micro-batches per step (gradient accumulation; default 1)")
    g.add_argument("--global-batch", type=int, default=None, metavar="B",
                   help="sequences per step; sets micro-batches to B / (dp x micro-batch-size)")
    g.add_argument("--order", default=DEFAULT_ORDER, help=f"rank order, fastest first (default {DEFAULT_ORDER})")


def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {pair}: expected KEY=VALUE, e.g. --set layers=4")
        out[key.strip()] = value.strip()
    return out


def plan_from_args(args) -> tuple[str, dict[str, str], Plan, bool]:
    """(model, overrides, plan, used_default) from parsed flags."""
    degrees_given = any(getattr(args, a) is not None for a in ("dp", "tp", "pp", "cp", "ep"))
    used_default = args.model is None and not degrees_given and not args.set
    model = args.model or DEFAULT_MODEL
    base = DEFAULT_PLAN if used_default else Plan()
    dp = args.dp if args.dp is not None else base.dp
    micro_batches = args.micro_batches
    if args.global_batch is not None:
        if args.global_batch < 1:
            raise UsageError(f"--global-batch {args.global_batch}: must be a positive integer")
        per_step = dp * args.micro_batch_size if dp > 0 and args.micro_batch_size > 0 else 0
        if per_step <= 0:
            pass  # Plan.check_basic names the bad degree
        elif args.global_batch % per_step:
            valid = [d for d in range(1, args.global_batch + 1) if args.global_batch % (d * args.micro_batch_size) == 0]
            raise UsageError(
                f"--dp {dp}: dp x micro-batch-size ({per_step}) must divide the global batch {args.global_batch}; "
                f"valid --dp: {', '.join(map(str, valid))}"
            )
        else:
            derived = args.global_batch // per_step
            if micro_batches is not None and micro_batches != derived:
                raise UsageError(
                    f"--micro-batches {micro_batches} contradicts --global-batch {args.global_batch} "
                    f"(which gives {derived} with dp {dp} and micro-batch size {args.micro_batch_size})"
                )
            micro_batches = derived
    plan = Plan(
        dp=dp, tp=1 if args.tp is None else args.tp, pp=1 if args.pp is None else args.pp,
        cp=1 if args.cp is None else args.cp, ep=1 if args.ep is None else args.ep,
        sp=args.sp, zero=args.zero, recompute=args.recompute, schedule=args.schedule,
        virtual_stages=args.virtual_stages, seq_len=args.seq_len, micro_batch_size=args.micro_batch_size,
        micro_batches=1 if micro_batches is None else micro_batches, order=args.order,
        grad_dtype=args.grad_dtype, optimizer_dtype=args.optimizer_dtype,
        stage_layers=None if args.stage_layers is None else parse_stage_layers(args.stage_layers),
    )
    return model, _overrides(args.set), plan, used_default


# --------------------------------------------------------------------------- commands


def _human(n: float, unit: str = "B") -> str:
    for prefix in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000 or prefix == "E":
            return f"{n:.3g} {prefix}{unit}" if prefix else f"{n:.0f} {unit}"
        n /= 1000
    return f"{n} {unit}"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _ranks_text(ranks: Sequence[int]) -> str:
    if not ranks:
        return "-"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ",".join(map(str, ranks[:8])) + ("..." if len(ranks) > 8 else "")


def cmd_generate(host: PluginHost, args) -> int:
    model, overrides, plan, used_default = plan_from_args(args)
    check_output_dir(args.output)  # before any work
    out = Path(args.output)
    start = time.perf_counter()
    result = plan_job(host, model, overrides, plan)
    write_trace_set(host, result, args.output, args.format, validate=not args.no_validate)
    seconds = time.perf_counter() - start
    nodes = sum(len(p.nodes) * len(p.ranks) for p in result.job.programs)
    what = f"{result.config.name}, {_plan_text(result.plan)}"
    if used_default:
        what += " (the default job)"
    check = "" if args.no_validate else ", validated"
    print(f"wrote {result.job.world_size} traces ({what}; {len(result.job.programs)} rank class"
          f"{'es' if len(result.job.programs) != 1 else ''}, {nodes:,} nodes) to {out}/ in {seconds:.2f} s{check}")
    return 0


def _plan_text(plan: Plan) -> str:
    parts = [f"{a}{plan.degree(a)}" for a in ("tp", "cp", "ep", "dp", "pp") if plan.degree(a) > 1] or ["1 GPU"]
    if plan.sp:
        parts.append("sp")
    if plan.zero:
        parts.append(f"zero{plan.zero}")
    if plan.recompute != "none":
        parts.append(f"recompute={plan.recompute}")
    parts.append(f"mbs{plan.micro_batch_size}x{plan.micro_batches}")
    parts.append(f"seq{plan.seq_len}")
    return " ".join(parts)


def cmd_report(host: PluginHost, args) -> int:
    model, overrides, plan, _ = plan_from_args(args)
    result = plan_job(host, model, overrides, plan)
    if args.json:
        print(json.dumps(result.manifest, indent=2))
        return 0
    m = result.manifest
    print(f"{result.config.name}  {_plan_text(result.plan)}  world {m['world_size']}  "
          f"(per rank, per training step; FLOPs and bytes)")
    if result.plan.pp > 1:
        print(f"layers per pipeline stage: {','.join(map(str, m['plan']['stage_layers']))}")
    for rc in m["rank_classes"]:
        print(f"\nranks {_ranks_text(rc['ranks'])}")
        f = rc["flops"]
        print(f"  FLOPs     matmul {f['matmul']:>22,}  other {f['other']:>20,}  total {f['total']:>22,}")
        mem = rc["memory_bytes"]
        print("  memory    " + "  ".join(f"{k} {_human(v)}" for k, v in mem.items()))
        comm = {k: v for k, v in rc["comm_bytes"].items() if v}
        print("  traffic   " + ("  ".join(f"{k} {_human(v)}" for k, v in comm.items()) or "none"))
    return 0


def cmd_validate(host: PluginHost, args) -> int:
    from .validate import validate

    directory = Path(args.dir)
    trace_set = read_trace_set(host, directory)
    problems = validate(trace_set)
    if args.json:
        print(json.dumps({"dir": str(directory), "ranks": trace_set.world_size, "valid": not problems,
                          "problems": [{"rank": p.rank, "node": p.node_id, "name": p.node_name, "reason": p.reason}
                                       for p in problems]}, indent=2))
        return 1 if problems else 0
    if problems:
        for p in problems:
            print(f"{directory}: {p}", file=sys.stderr)
        return 1
    print(f"{directory}: {trace_set.world_size} ranks, valid")
    return 0


def cmd_models(host: PluginHost, args) -> int:
    rows = []
    for spec in host.models():
        for name in sorted(spec.presets):
            total, active = param_counts(spec.build(spec.presets[name]))
            rows.append({"name": name, "family": spec.family, "plugin": spec.plugin,
                         "params_total": total, "params_active": active})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no models: install a model plugin (stage-model-gpt, stage-model-llama, stage-model-moe)"
              + host.broken_hint())
        return 0
    width = max(len(r["name"]) for r in rows)
    print(f"{'model':<{width}}  {'family':<8} {'params':>10} {'active':>10}  plugin")
    for r in rows:
        print(f"{r['name']:<{width}}  {r['family']:<8} {_count(r['params_total']):>10} "
              f"{_count(r['params_active']):>10}  {r['plugin']}")
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
    parser = _Parser(prog=PROG, description="Synthesize per-GPU execution traces of distributed LLM training.")
    parser.add_argument("--version", action="version", version=f"stage {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("generate", help="write one trace per GPU (default: gpt-tiny on 8 GPUs into ./traces)")
    _add_plan_flags(p)
    p.add_argument("--format", default="chakra", help="trace format (chakra or chakra-json)")
    p.add_argument("-o", "--output", default="traces", metavar="DIR", help="output folder (default ./traces)")
    p.add_argument("--no-validate", action="store_true", help="skip checking the set before it is moved into place")
    p.set_defaults(run=cmd_generate)

    p = sub.add_parser("report", help="FLOPs, memory and traffic per rank class, without writing traces")
    _add_plan_flags(p)
    p.add_argument("--json", action="store_true", help="print the manifest's JSON instead of a table")
    p.set_defaults(run=cmd_report)

    p = sub.add_parser("validate", help="check a trace set (ids, dependencies, collectives, send/recv)")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--json", action="store_true", help="print the verdict and the problems as JSON")
    p.set_defaults(run=cmd_validate)

    p = sub.add_parser("models", help="list model presets with their parameter counts")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_models)

    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_plugins)

    if host is not None:
        for spec in host.commands():
            if spec.name in sub.choices:
                raise PluginError(f"plugin {spec.plugin!r} adds command {spec.name!r}, which exists already")
            p = sub.add_parser(spec.name, help=spec.help)
            spec.configure(p)
            p.set_defaults(run=lambda h, a, _spec=spec: _spec.run(a))
    return parser


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
        return int(args.run(host, args) or 0)
    except TraceError as exc:
        for problem in exc.problems:
            print(f"{PROG}: invalid trace: {problem}", file=sys.stderr)
        return exc.exit_status
    except StageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
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
