"""Plans from settings: the one way a model and a parallel plan are chosen.

A *setting* is a ``stage generate``/``report`` flag without its dashes and its value:
``{"model": "gpt3-175b", "tp": 8, "sp": True, "micro-batches": 16, "set": ["layers=4"]}``
(``True``/``False`` turn a switch on or off, a list repeats a flag; values may be typed
or strings).  :func:`plan_from_settings` turns settings into a :class:`PlanRequest`; the
command line, named plans (``--plan``), ``stage search``, ``stage sweep`` and plugin
commands all go through it, so a setting means the same everywhere.

Plugin commands that take a plan add the same flags to their parser with
:func:`add_plan_flags` (and ``--gpu`` with :func:`add_gpu_flag`) and read them back
with :func:`plan_from_args`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Mapping, Sequence

from .bounds import BYTES_PER_NODE, DEFAULT_MAX_NODES
from .errors import UsageError
from .guard import fault
from .parallel.plan import CHOICES, COUNTS, DEFAULT_ORDER, Plan, divisors, flag, parse_stage_layers
from .records import PlanSpec, ScheduleSpec

DEFAULT_MODEL = "gpt-tiny"
DEFAULT_PLAN = Plan(dp=8)

#: settings that choose a model, not a plan
MODEL_SETTINGS = ("model", "set")
#: settings of serving (--task serve) that are not fields of a Plan
SERVE_SETTINGS = ("prefill-ranks", "decode-ranks", "prefill-plan", "decode-plan")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (a UsageError) and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse's API
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _count_flag(g, field_name: str, metavar: str, help: str) -> None:
    """A flag for a Plan field in ``plan.COUNTS`` (checked by Plan.check_basic)."""
    assert field_name in COUNTS, field_name
    g.add_argument(flag(field_name), type=int, metavar=metavar, help=help)


def _choice_flag(g, field_name: str, help: str) -> None:
    """A flag for a Plan field in ``plan.CHOICES``: --help lists the values Plan.check_basic accepts."""
    valid = CHOICES[field_name]
    g.add_argument(flag(field_name), type=type(valid[0]), metavar="|".join(map(str, valid)),
                   help=f"{help} (default {getattr(Plan(), field_name)})")


def _host_choice_flag(g, name: str, valid: Sequence[str], default: str, help: str) -> None:
    """A flag whose values plugins provide (schedules, trace formats): listed from the host.
    (Its parsed default is None, as for every plan flag; ``default`` is for --help.)"""
    g.add_argument(name, metavar="|".join(valid) or "NAME", help=f"{help} (default {default})")


def add_plan_flags(p: argparse.ArgumentParser, host=None, writes: bool = True) -> None:
    """The model, plan and batch flags of ``stage generate`` and ``report``; plugin commands
    that take a plan add them too and read them back with :func:`plan_from_args`.  With a
    ``host``, the schedules it knows are listed in ``--help``.  ``writes``: whether the
    command lowers the whole set (``--max-nodes`` bounds its nodes), or only reports on it
    (``--max-nodes`` then bounds the world size)."""
    # every default is None: a flag left out takes the --plan's value, else the Plan default
    if host is None:  # a plugin command's parser: the host it runs with (stage_core.cli sets it)
        host = getattr(p, "stage_host", None)
    g = p.add_argument_group("model")
    g.add_argument("--model", help=f"a preset name (see `stage models`) or a Hugging Face config.json "
                                   f"(default: {DEFAULT_MODEL}; with no --model, --plan, --set or degree given, the "
                                   f"default job: {DEFAULT_MODEL} on dp {DEFAULT_PLAN.dp})")
    g.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="override a field of the model config, or a key of its config.json (e.g. "
                        "num_hidden_layers=4; repeatable)")
    g.add_argument("--family", metavar="NAME", help="read the config.json as this model family (default: the "
                                                    "family whose keys it has; see `stage models`)")
    g = p.add_argument_group("parallel plan")
    g.add_argument("--plan", metavar="NAME", help="start from a named plan (see `stage plans`); the flags given "
                                                  "alongside override its settings")
    for axis, text in (("dp", "data parallel"), ("tp", "tensor parallel"), ("pp", "pipeline parallel"),
                       ("cp", "context parallel"), ("ep", "expert parallel (carved out of dp x cp)")):
        job = f"; {DEFAULT_PLAN.dp} in the default job" if axis == "dp" else ""
        _count_flag(g, axis, "N", f"{text} degree (default 1{job})")
    _choice_flag(g, "cp_comm", "context-parallel attention: p2p (ring, as TransformerEngine), all-gather (K and "
                               "V, as Llama 3) or a2a (sequence <-> heads, as DeepSpeed-Ulysses)")
    g.add_argument("--etp", type=int, metavar="N", help="expert layers' tensor parallel degree (default: tp)")
    _choice_flag(g, "moe_dispatcher", "how routed tokens reach their experts: all-to-all of tokens x top-k "
                                      "rows, or all-gather of the tokens (Megatron's token dispatchers)")
    g.add_argument("--moe-capacity-factor", type=float, metavar="F",
                   help="pad every expert to ceil(tokens x top-k x F / experts) rows of each rank's tokens "
                        "(default: the model's; dropless routing unless it sets one)")
    g.add_argument("--moe-imbalance", type=float, metavar="F",
                   help="rows of the busiest expert over its uniform share; every rank is sized as the one "
                        "holding it (default 1: uniform routing)")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, help="Megatron sequence parallel (with --tp)")
    _choice_flag(g, "zero", "ZeRO stage (3 = FSDP)")
    _choice_flag(g, "recompute", "activation recompute")
    schedules = [s.name for s in host.schedules()] if host is not None else []
    _host_choice_flag(g, "--schedule", schedules, Plan().schedule, "pipeline schedule")
    _count_flag(g, "virtual_stages", "V", "virtual stages per pipeline rank (default 1)")
    g.add_argument("--stage-layers", metavar="auto|N,N,...",
                   help="layers per pipeline stage (pp x virtual-stages counts, in order; NxK for K stages of N; "
                        "the first and last may be 0: the embedding or the head alone), or auto: balanced by "
                        "compute, the embedding and the LM head counted as one layer each (default: an even split)")
    _choice_flag(g, "grad_dtype", "gradient buffers and their reduction (Megatron keeps fp32 main grads)")
    _choice_flag(g, "optimizer_dtype", "master weights, momentum and variance")
    g = p.add_argument_group("task")
    _choice_flag(g, "task", "train; prefill: the forward pass of the prompts, writing the KV cache; decode: one "
                            "new token per request reading the KV cache; serve: prefill and decode on ranks of "
                            "their own (--prefill-ranks, --decode-ranks), the KV cache sent from one to the other")
    g.add_argument("--context-len", type=int, metavar="C",
                   help="decode: tokens each request attends to, its new one included (default: the model's "
                        "sequence length)")
    _count_flag(g, "decode_steps", "N", "decode: chain N steps in one trace, the context growing a token a step "
                                        "(default 1)")
    g.add_argument("--prefill-ranks", type=int, metavar="P", help="serve: ranks 0..P-1 run prefill")
    g.add_argument("--decode-ranks", type=int, metavar="D", help="serve: the next D ranks run decode")
    g.add_argument("--prefill-plan", metavar="KEY=VALUE,...",
                   help="serve: the prefill side's own tp, pp, dp, cp, cp-comm, ep, etp, moe-dispatcher, "
                        "micro-batch-size, micro-batches over the main flags (dp: its ranks over tp x cp x pp by "
                        "default)")
    g.add_argument("--decode-plan", metavar="KEY=VALUE,...",
                   help="serve: the decode side's own settings, as --prefill-plan (no cp)")
    g = p.add_argument_group("batch")
    g.add_argument("--seq-len", type=int, metavar="S", help="tokens per sequence (default: the model's)")
    _count_flag(g, "micro_batch_size", "b", "sequences per micro-batch (default 1)")
    _count_flag(g, "micro_batches", "m", "micro-batches per step (gradient accumulation; default 1)")
    g.add_argument("--global-batch", type=int, metavar="B",
                   help="sequences per step; sets micro-batches to B / (dp x micro-batch-size)")
    g.add_argument("--order", help=f"rank order, fastest first (default {DEFAULT_ORDER})")
    if host is not None:
        _add_option_flags(p, host)
    g = p.add_argument_group("limits")
    about = f"about {DEFAULT_MAX_NODES * BYTES_PER_NODE // 10**9} GB as Chakra ET"
    g.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES, metavar="N",
                   help=f"refuse a trace set of more nodes, all ranks together (default {DEFAULT_MAX_NODES:,}, "
                        f"{about})" if writes else
                   f"refuse a world of more than N ranks (each rank's trace holds a node at least; this command "
                   f"writes no set, so it lowers no more than it needs to report; default {DEFAULT_MAX_NODES:,})")


def _add_option_flags(p: argparse.ArgumentParser, host) -> None:
    """The options strategies and schedules declare (:class:`~stage_core.records.OptionSpec`),
    one flag each, grouped under the strategy or schedule and its plugin."""
    groups: dict[int, Any] = {}
    for spec, opt in host.options():
        g = groups.get(id(spec))
        if g is None:
            kind = "schedule" if isinstance(spec, ScheduleSpec) else "strategy"
            g = groups[id(spec)] = p.add_argument_group(f"{kind} {spec.name} (plugin {spec.plugin})")
        opt.add_to(g)


def add_gpu_flag(p: argparse.ArgumentParser, host=None, default: str | None = None) -> None:
    """``--gpu``: a hardware preset (listed from ``host``) or a hardware file.  ``default``:
    the GPU a command takes when none is given (its --help says so; None: untimed).  A
    named plan's GPU comes before ``default``, as the help says."""
    if host is None:
        host = getattr(p, "stage_host", None)
    presets = [h.name for h in host.hardware()] if host is not None else []
    fallback = f"default: the --plan's GPU, else {default}" if default else "default: the --plan's GPU, else untimed"
    p.add_argument("--gpu", metavar="|".join([*presets, "FILE", "none"]),
                   help="time every kernel on this GPU: a hardware preset or a hardware file (`stage calibrate` "
                        f"writes one); each compute node gets its duration ({fallback}; none: untimed, the "
                        "simulator's roofline times the kernels)")


# --------------------------------------------------------------------------- settings -> plan


@dataclass(frozen=True)
class PlanRequest:
    """What settings ask for: the model (a preset or a config.json path) with its ``--set``
    overrides, the :class:`Plan`, the GPU named (``--gpu``, or the named plan's), the
    named plan applied, serving's side settings, and whether nothing was given at all
    (the default job)."""

    model: str
    overrides: dict[str, str]
    plan: Plan
    gpu: str | None = None
    plan_name: str | None = None
    used_default: bool = False
    serve: Mapping[str, Any] = field(default_factory=dict)
    given: frozenset[str] = frozenset()  # the settings given (a named plan's included)
    family: str | None = None  # --family: the family a config.json is read as
    notes: tuple[str, ...] = ()  # what the settings changed that the user may not expect (stage prints them)


def settings_flags(settings: Mapping[str, Any]) -> list[str]:
    """``settings`` as command-line arguments (``{"tp": 8, "sp": True}`` -> ``--tp 8 --sp``)."""
    out: list[str] = []
    for key, value in settings.items():
        if value is None:
            continue
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


def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {pair}: expected KEY=VALUE, e.g. --set layers=4")
        out[key.strip()] = value.strip()
    return out


def _listed(values: Sequence[int], most: int = 12) -> str:
    return ", ".join(map(str, values[:most])) + (", ..." if len(values) > most else "")


@lru_cache(maxsize=8)
def _settings_parser(host) -> argparse.ArgumentParser:
    p = _Parser(prog="settings", add_help=False)
    add_plan_flags(p, host)
    add_gpu_flag(p, None)
    return p


def setting_names(host=None) -> tuple[str, ...]:
    """Every setting name :func:`plan_from_settings` takes (flags without dashes)."""
    names = []
    for action in _settings_parser(host)._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and not opt.startswith("--no-"):
                names.append(opt[2:])
    return tuple(names)


def _namespace(settings: Mapping[str, Any], host, where: str) -> argparse.Namespace:
    known = set(setting_names(host))
    unknown = [k for k in settings if k not in known]
    if unknown:
        raise UsageError(f"{where}: unknown setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
    try:
        return _settings_parser(host).parse_args(settings_flags(settings))
    except UsageError as exc:
        raise UsageError(f"{where}: {str(exc).removeprefix('settings: ').split(' (see settings')[0]}") from None


def _merged(spec: PlanSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """A named plan's settings under the ones given: a batch given either way (micro-batches
    or global-batch) replaces the plan's batch; ``set`` pairs add to the plan's."""
    merged = {k: v for k, v in spec.settings.items()}
    if "micro-batches" in given or "global-batch" in given:
        merged.pop("micro-batches", None)
        merged.pop("global-batch", None)
    for key, value in given.items():
        if key == "plan":
            continue
        if key == "set":
            merged["set"] = [*(merged.get("set") or []), *value]
        else:
            merged[key] = value
    return merged


def plan_from_settings(settings: Mapping[str, Any], host=None) -> PlanRequest:
    """The model and plan that ``settings`` ask for (see the module docstring).

    ``"plan": NAME`` starts from the named plan (``host.plan(NAME)``) under the other
    settings.  Raises :class:`UsageError` naming the setting when one is unknown or bad
    (and :class:`PluginError` naming the plugin when a named plan's own setting is bad).
    """
    settings = {k: v for k, v in settings.items() if v is not None}
    if "set" in settings and isinstance(settings["set"], str):
        settings["set"] = [settings["set"]]
    given = _namespace(settings, host, "plan settings")
    plan_name = None
    if settings.get("plan") is not None:
        name = str(settings["plan"])
        if not name.strip():
            raise UsageError("--plan '': empty; give a plan name (see `stage plans`)")
        if host is None:
            from .plugins import PluginHost

            host = PluginHost()
        spec = host.plan(name)
        try:
            _namespace(dict(spec.settings), host, f"plan {spec.name}")
        except UsageError as exc:
            owner = host.owner(spec.plugin, "plan", spec.name)
            raise fault(owner, f"has a bad setting: {str(exc).removeprefix(f'plan {spec.name}: ')}") from None
        own, asked = dict(spec.settings), dict(settings)
        settings = _merged(spec, settings)
        plan_name = spec.name
    args = _namespace(settings, host, "plan settings")
    degrees_given = any(getattr(given, a) is not None for a in ("dp", "tp", "pp", "cp", "ep", "etp"))
    used_default = given.model is None and not degrees_given and not given.set and plan_name is None
    request = _request(args, host, used_default, plan_name, frozenset(settings))
    if plan_name is not None:
        request = replace(request, notes=_batch_notes(own, asked, request, host))
    return request


def _batch_notes(own: Mapping[str, Any], asked: Mapping[str, Any], request: PlanRequest, host) -> tuple[str, ...]:
    """A note when the settings given alongside a named plan change its global batch (a
    --micro-batches or --dp of its own replaces the plan's batch, which is easily missed)."""
    try:
        before = _request(_namespace(own, host, "plan settings"), host, False, None, frozenset(own)).plan
    except UsageError:
        return ()
    after = request.plan
    if before.global_batch == after.global_batch or after.task != before.task:
        return ()
    changed = [f"--{k} {v}" for k, v in asked.items()
               if k in ("dp", "micro-batches", "micro-batch-size", "global-batch") and own.get(k) != v]
    why = f" with {', '.join(changed)}" if changed else ""
    return (f"plan {request.plan_name}: its global batch of {before.global_batch:,} sequences becomes "
            f"{after.global_batch:,}{why} (dp {after.dp} x micro-batch size {after.micro_batch_size} x "
            f"{after.micro_batches} micro-batches); give --global-batch {before.global_batch} to keep it",)


def settings_from_args(args: argparse.Namespace, host=None) -> dict[str, Any]:
    """The settings given on a command line parsed by a parser with :func:`add_plan_flags`:
    every setting whose flag was given (flags left out are absent)."""
    out = {}
    for name in setting_names(host):
        value = getattr(args, name.replace("-", "_"), None)
        if value is None or (name == "max-nodes" and value == DEFAULT_MAX_NODES):
            continue
        out[name] = value
    return out


def plan_from_flags(flags: Sequence[str], host=None) -> PlanRequest:
    """:func:`plan_from_settings` of command-line flags (``["--tp", "8", "--sp"]``)."""
    args = _settings_parser(host).parse_args(list(flags))
    return plan_from_settings(settings_from_args(args, host), host)


def plan_from_args(args: argparse.Namespace, host=None) -> PlanRequest:
    """:func:`plan_from_settings` of the flags on a parser that has :func:`add_plan_flags`."""
    return plan_from_settings(settings_from_args(args, host), host)


def _request(args: argparse.Namespace, host, used_default: bool, plan_name: str | None,
             given_names: frozenset[str]) -> PlanRequest:
    model = DEFAULT_MODEL if args.model is None else args.model
    if not model.strip():
        raise UsageError(f"--model {model!r}: empty; give a preset name (see `stage models`) or a config.json path")
    base = DEFAULT_PLAN if used_default else Plan()

    def given(name: str):
        value = getattr(args, name)
        return getattr(base, name) if value is None else value

    dp, micro_batch_size = given("dp"), given("micro_batch_size")
    micro_batches = args.micro_batches
    if args.global_batch is not None:
        if args.global_batch < 1:
            raise UsageError(f"--global-batch {args.global_batch}: must be a positive integer")
        per_step = dp * micro_batch_size if dp > 0 and micro_batch_size > 0 else 0
        if per_step <= 0:
            pass  # Plan.check_basic names the bad degree
        elif args.global_batch % micro_batch_size:
            raise UsageError(
                f"--micro-batch-size {micro_batch_size} must divide the global batch {args.global_batch}; "
                f"valid --micro-batch-size: {_listed(divisors(args.global_batch))}"
            )
        elif args.global_batch % per_step:
            raise UsageError(
                f"--dp {dp}: dp x micro-batch-size ({per_step}) must divide the global batch {args.global_batch}; "
                f"valid --dp: {_listed(divisors(args.global_batch // micro_batch_size))}"
            )
        else:
            derived = args.global_batch // per_step
            if micro_batches is not None and micro_batches != derived:
                raise UsageError(
                    f"--micro-batches {micro_batches} contradicts --global-batch {args.global_batch} "
                    f"(which gives {derived} with dp {dp} and micro-batch size {micro_batch_size})"
                )
            micro_batches = derived
    plan = Plan(
        dp=dp, tp=given("tp"), pp=given("pp"), cp=given("cp"), ep=given("ep"), cp_comm=given("cp_comm"),
        etp=given("etp"), moe_dispatcher=given("moe_dispatcher"), moe_capacity_factor=given("moe_capacity_factor"),
        moe_imbalance=given("moe_imbalance"), sp=given("sp"), zero=given("zero"),
        recompute=given("recompute"), schedule=given("schedule"), virtual_stages=given("virtual_stages"),
        seq_len=args.seq_len, micro_batch_size=micro_batch_size,
        micro_batches=base.micro_batches if micro_batches is None else micro_batches, order=given("order"),
        grad_dtype=given("grad_dtype"), optimizer_dtype=given("optimizer_dtype"),
        stage_layers=None if args.stage_layers is None else parse_stage_layers(args.stage_layers),
        task=given("task"), context_len=args.context_len, decode_steps=given("decode_steps"),
        options=_options(args, host),
    )
    serve = {name: getattr(args, name.replace("-", "_")) for name in SERVE_SETTINGS}
    family = getattr(args, "family", None)
    if host is not None:
        host.hf_family = family  # the host reads a config.json as this family (PluginHost.config_from_hf)
    return PlanRequest(model, _overrides(args.set or []), plan, getattr(args, "gpu", None), plan_name,
                       used_default, serve, given_names, family)


def _options(args: argparse.Namespace, host) -> tuple[tuple[str, Any], ...]:
    """The strategy and schedule options given (each option's default is left out, so a
    plan names only what was chosen)."""
    if host is None:
        return ()
    out = []
    for _, opt in host.options():
        value = getattr(args, opt.dest, None)
        if value is not None and value != opt.default:
            out.append((opt.name, value))
    return tuple(sorted(out))
