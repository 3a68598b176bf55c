"""Fixtures for plugin authors (and the core's own tests).

* :func:`fresh_host` - a plugin host without entry-point autoload, with the
  core's built-ins and whatever plugins you pass.
* :class:`ToyConfig` / :data:`toy_plugin` - a tiny GPT-like model (attention and
  MLP with the layout conventions the standard strategies expect), so a strategy
  or backend can be tested without installing a model plugin.
* :data:`jsonl_plugin` - a plain JSON-lines trace backend (with a reader), to
  write and check trace sets without a format adapter installed.
* :func:`check_trace_set` - decode and validate a trace set; raises with every
  problem listed.
* :func:`strategy_matrix` - every combination of the standard strategies, as plans
  for the toy model (with :func:`matrix_overrides` and :func:`plan_id`).

With pytest, ``from stage_core.testing import *`` in a conftest gives the
``stage_host`` fixture.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Iterable

from .errors import TraceError
from .hookspecs import hookimpl
from .ir.builder import GraphBuilder
from .models import DTYPES, ModelConfig, check_choice, check_divides, check_int, check_str
from .parallel import Plan
from .plugins import PluginHost
from .rankset import parse_ranks
from .parallel.placement import Replicate
from .records import BackendSpec, ModelSpec, StrategySpec
from .trace import NodeType, TraceNode, TraceSet

__all__ = ["fresh_host", "ToyConfig", "build_toy", "toy_plugin", "write_jsonl", "read_jsonl", "jsonl_plugin",
           "check_trace_set", "strategy_matrix", "matrix_overrides", "plan_id", "stage_host", "reference_strategies",
           # the conformance kit
           "assert_param_count", "assert_forward_flops", "assert_config_round_trips", "assert_flops_conserved",
           "assert_tasks", "assert_tp_shards_or_warns", "assert_schedule_structure", "assert_schedule_like_1f1b",
           "assert_strategy_conserves", "assert_backend_round_trip", "matrix_plans", "one_device_matmul_flops",
           "ranks_matmul_flops", "SCHEDULE_CASES", "assert_hardware_preset", "assert_executor", "assert_simulator",
           "assert_estimator"]


def fresh_host(*plugins: tuple[object, str], disabled: Iterable[str] = ()) -> PluginHost:
    """A host with the core's built-ins and ``(plugin, name)`` pairs; no autoload."""
    host = PluginHost(autoload=False, disabled=disabled)
    for plugin, name in plugins:
        host.register(plugin, name)
    host.check()
    return host


# --------------------------------------------------------------------------- a tiny model


@dataclasses.dataclass(frozen=True)
class ToyConfig(ModelConfig):
    name: str = "toy"
    family: str = "toy"
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    ffn: int = 256
    vocab: int = 128
    seq_len: int = 32
    dtype: str = "bf16"

    def __post_init__(self):  # the shared checks a model family's config makes
        check_str(self, "name")
        check_int(self, "layers", "hidden", "heads", "ffn", "vocab", "seq_len")
        check_divides(self, "heads", "hidden", f"the head dim is hidden/heads; valid head counts divide {self.hidden}")
        check_choice(self, "dtype", DTYPES)
    attention: str = "classic"  # or "flash": one fused kernel
    causal_flops: bool = False


def build_toy(c: ToyConfig):
    """A GPT-like model: learned nothing, tied embeddings, classic (or flash) attention (keys
    and values declared as the inference cache), GeLU MLP."""
    d = c.hidden // c.heads
    g = GraphBuilder(c.name, dims={"h": c.hidden, "a": c.heads, "g": c.heads, "d": d, "f": c.ffn, "V": c.vocab},
                     dtype=c.dtype)
    tokens = g.input("tokens", ("b", "s"))
    labels = g.input("labels", ("b", "s"))
    wte = g.param("embed.wte", ("V", "h"))
    x = g.dropout(g.embedding(tokens, wte), name="embed.dropout", tags=("residual",))
    for i in range(c.layers):
        with g.layer(i):
            y = g.norm("layernorm", x, g.param("ln1.w", ("h",)), g.param("ln1.b", ("h",)), name="ln1")
            qkv = g.einsum("bsh,hgcd->bsgcd", y, g.param("attn.wqkv", ("h", "g", 3, "d")), name="attn.qkv",
                           bias=g.param("attn.bqkv", ("g", 3, "d")))
            q, k, v = g.split(qkv, "bsgcd->bsgrd,bsgd,bsgd", [("b", "s", "g", 1, "d"), ("b", "s", "g", "d"),
                                                                 ("b", "s", "g", "d")], name="attn.split")
            k, v = g.cache(k, name="attn.k_cache"), g.cache(v, name="attn.v_cache")  # what inference keeps
            with g.block("attn_core"):
                if c.attention == "flash":
                    ctx = g.flash_attention(q, k, v, causal_flops=c.causal_flops, name="attn.flash")
                else:
                    scale = 0.5 if c.causal_flops else 1
                    scores = g.einsum("bsgrd,bkgd->bgrsk", q, k, name="attn.scores", flops_scale=scale)
                    probs = g.dropout(g.softmax(scores, name="attn.softmax"), name="attn.dropout")
                    ctx = g.einsum("bgrsk,bkgd->bsgrd", probs, v, name="attn.context", flops_scale=scale)
            out = g.einsum("bsgrd,grdh->bsh", ctx, g.param("attn.wo", ("g", 1, "d", "h")), name="attn.out")
            x = g.dropout_add(out, x, g.param("attn.bo", ("h",)), name="attn.residual", tags=("residual",))
            y = g.norm("layernorm", x, g.param("ln2.w", ("h",)), g.param("ln2.b", ("h",)), name="ln2")
            u = g.einsum("bsh,hf->bsf", y, g.param("mlp.w1", ("h", "f")), name="mlp.fc1")
            u = g.bias_gelu(u, g.param("mlp.b1", ("f",)), name="mlp.gelu")
            z = g.einsum("bsf,fh->bsh", u, g.param("mlp.w2", ("f", "h")), name="mlp.fc2")
            x = g.dropout_add(z, x, g.param("mlp.b2", ("h",)), name="mlp.residual", tags=("residual",))
    y = g.norm("layernorm", x, g.param("final_ln.w", ("h",)), g.param("final_ln.b", ("h",)), name="final_ln")
    logits = g.einsum("bsh,vh->bsv", y, wte, name="head")
    return g.finish(g.cross_entropy(logits, labels))


class _ToyPlugin:
    @hookimpl
    def stage_models(self):
        return [ModelSpec(name="toy", family="toy", build=build_toy,
                          presets={"toy": ToyConfig(), "toy-wide": ToyConfig(name="toy-wide", hidden=128, ffn=512)},
                          from_dict=ToyConfig.from_dict)]


toy_plugin = _ToyPlugin()


# --------------------------------------------------------------------------- a plain backend


def _jsonl_nodes(job, rank: int, program) -> list[dict]:
    groups: dict[str, str] = {}
    peers: dict[str, int] = {}
    out = []
    for n in program.nodes:
        attrs = {"is_cpu_op": ["bool_val", False]}
        if n.type == NodeType.COMP:
            attrs["num_ops"] = ["int64_val", n.num_ops]
            attrs["tensor_size"] = ["uint64_val", n.tensor_size]
        elif n.type == NodeType.COMM_COLL:
            attrs["comm_type"] = ["int64_val", int(n.comm_type)]
            attrs["comm_size"] = ["int64_val", n.comm_size]
            if n.group is not None:
                if n.group not in groups:
                    groups[n.group] = job.group_name(rank, n.group)
                attrs["pg_name"] = ["string_val", groups[n.group]]
        else:
            if n.peer not in peers:
                peers[n.peer] = job.peer_rank(rank, n.peer)
            side = "comm_dst" if n.type == NodeType.COMM_SEND else "comm_src"
            attrs[side] = ["int32_val", peers[n.peer]]
            attrs["comm_tag"] = ["int32_val", n.tag]
            attrs["comm_size"] = ["int64_val", n.comm_size]
        out.append({"id": n.id, "name": n.name, "type": int(n.type), "data_deps": list(n.data_deps),
                    "ctrl_deps": list(n.ctrl_deps), "attrs": attrs, "duration_micros": n.duration_micros})
    return out


def write_jsonl(job, out_dir: Path) -> None:
    """Write ``trace.<rank>.jsonl``: one JSON node per line, attributes tagged with
    the protobuf oneof a Chakra writer would use."""
    wanted = None if job.ranks is None else set(job.ranks)
    for program in job.programs:
        for rank in program.ranks:
            if wanted is not None and rank not in wanted:
                continue
            with open(Path(out_dir) / f"trace.{rank}.jsonl", "w") as f:
                for node in _jsonl_nodes(job, rank, program):
                    f.write(json.dumps(node) + "\n")
            if job.progress is not None:
                job.progress(1)


def read_jsonl(directory: Path) -> TraceSet:
    directory = Path(directory)
    files = sorted(directory.glob("trace.*.jsonl"), key=lambda p: int(p.name.split(".")[1]))
    groups = json.loads((directory / "comm_groups.json").read_text())

    def ranks():
        for path in files:
            nodes = []
            for line in path.read_text().splitlines():
                d = json.loads(line)
                nodes.append(TraceNode(d["id"], d["name"], d["type"], d["data_deps"], d["ctrl_deps"],
                                       {k: (v[0], v[1]) for k, v in d["attrs"].items()},
                                       d.get("duration_micros", 0)))
            yield int(path.name.split(".")[1]), nodes

    path = directory / "manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else {}  # (a set whose manifest is gone)
    part = manifest.get("subset")
    if part is None:
        return TraceSet(world_size=len(files), comm_groups=groups, iter_ranks=ranks)
    world = manifest["world_size"]
    return TraceSet(world_size=world, comm_groups=groups, iter_ranks=ranks,
                    ranks=parse_ranks(part["ranks"], world))


class _JsonlPlugin:
    @hookimpl
    def stage_trace_backends(self):
        return [BackendSpec(name="jsonl", write=write_jsonl, read=read_jsonl,
                            detect=lambda d: any(Path(d).glob("trace.*.jsonl")), format_id="stage-jsonl")]


jsonl_plugin = _JsonlPlugin()


# --------------------------------------------------------------------------- reference strategies


class _ReferencePlugin:
    """Data and pipeline parallel as the core needs them, nothing more (stage-parallel's
    dp and pp declare the same): so a schedule or model plugin can lower pipelined and
    data-parallel plans in its own tests, with only the core installed."""

    @staticmethod
    def apply_dp(sg, mesh, plan):
        if plan.dp > 1:
            sg.shard_inputs("dp", "b")
            sg.grad_target["dp"] = Replicate()
        return sg

    @staticmethod
    def apply_pp(sg, mesh, plan):
        sg.pipeline = (plan.pp, plan.virtual_stages)
        if isinstance(plan.stage_layers, tuple):
            sg.stage_layers = tuple(plan.stage_layers)
        return sg

    @hookimpl
    def stage_strategies(self):
        return [StrategySpec("dp", "dp", lambda model, plan: [], self.apply_dp, order=10,
                             description="reference data parallel (stage_core.testing)"),
                StrategySpec("pp", "pp", lambda model, plan: [], self.apply_pp, order=50,
                             description="reference pipeline parallel (stage_core.testing)")]


#: reference ``dp`` and ``pp`` strategies for tests without stage-parallel
reference_strategies = _ReferencePlugin()


# --------------------------------------------------------------------------- trace checks


def check_trace_set(host: PluginHost, directory: Path) -> None:
    """Decode ``directory`` with its backend and raise TraceError listing every problem."""
    from .flow import read_trace_set
    from .validate import validate

    problems = validate(read_trace_set(host, Path(directory)))
    if problems:
        raise TraceError([str(p) for p in problems])


# --------------------------------------------------------------------------- the strategy matrix


def strategy_matrix() -> list[Plan]:
    """Every combination of the standard strategies, for the toy model: dp and tp
    (1, 2), sp, ZeRO 0-3, recompute none/selective/full, 1 or 2 micro-batches; and pp 2
    under 1f1b, gpipe and interleaved (2 virtual stages) with dp, tp with sp, ZeRO 0, 1,
    3 and recompute none/full, 4 micro-batches.  The strategies' own tests and the
    simulator's run the same list."""
    flat = [
        Plan(dp=dp, tp=tp, sp=sp, zero=zero, recompute=rc, micro_batches=m)
        for dp, tp, sp, zero, rc, m in itertools.product(
            (1, 2), (1, 2), (False, True), (0, 1, 2, 3), ("none", "selective", "full"), (1, 2))
        if not (sp and tp == 1) and not (zero and dp == 1)
    ]
    piped = [
        Plan(pp=2, dp=dp, tp=tp, sp=tp > 1, zero=zero, recompute=rc, micro_batches=4,
             schedule=schedule, virtual_stages=2 if schedule == "interleaved" else 1)
        for dp, tp, zero, rc, schedule in itertools.product(
            (1, 2), (1, 2), (0, 1, 3), ("none", "full"), ("1f1b", "gpipe", "interleaved"))
        if not (zero and dp == 1)
    ]
    return flat + piped


def matrix_overrides(plan: Plan) -> dict[str, str]:
    """Model overrides a matrix plan needs on the toy model (interleaving needs 4 layers)."""
    return {"layers": "4"} if plan.virtual_stages > 1 else {}


def plan_id(plan: Plan) -> str:
    """A short test id: ``dp2-tp2-sp-pp2-1f1b-z1-full-m4``."""
    return (f"dp{plan.dp}-tp{plan.tp}{'-sp' if plan.sp else ''}-pp{plan.pp}"
            f"{'-' + plan.schedule if plan.pp > 1 else ''}-z{plan.zero}-{plan.recompute}"
            f"-m{plan.micro_batches}")


try:  # pytest fixtures, when pytest is there
    import pytest

    @pytest.fixture
    def stage_host() -> PluginHost:
        """A fresh plugin host with the toy model and the jsonl backend, no autoload."""
        return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"))

except ImportError:  # pragma: no cover
    pass


# --------------------------------------------------------------------------- the conformance kit
# One-line checks a plugin author runs against their own plugin (docs/plugins.md, "Testing with
# the kit").  Each raises AssertionError saying what differs, or skips (pytest.skip) with the
# reason when the host lacks what the check needs (a strategy, a simulator).


def _skip(reason: str):
    import pytest

    pytest.skip(reason)


def _plan(host: PluginHost, model: str, plan: Plan, overrides=None, gpu=None, **kw):
    from .flow import plan_job

    return plan_job(host, model, dict(overrides or {}), plan, gpu, **kw)


def _matching(name: str, patterns) -> bool:
    return any(p in name for p in patterns)


def one_device_matmul_flops(result, exclude=()) -> int:
    """Matmul FLOPs of the whole step on one device, from the task's graph itself: forward,
    backward and what recompute redoes, times the micro-batches (ops whose name contains one
    of ``exclude`` left out)."""
    from . import sym

    graph, plan = result.training, result.plan
    values = dict(graph.dims, b=plan.micro_batch_size * plan.dp, s=plan.seq_len)
    if plan.inference:
        values.update({"ctx": plan.context_len or plan.seq_len})
    fwd = [op for op in graph.forward_ops if op.is_kernel and not _matching(op.name, exclude)]
    bwd = [op for op in graph.backward_ops if op.is_kernel and not _matching(op.name, exclude)]
    recomputed = {"none": [], "full": [op for op in fwd if op.layer is not None],
                  "selective": [op for op in fwd if op.block == "attn_core"]}[plan.recompute]
    exprs = [op.matmul_flops for op in fwd + bwd + recomputed]
    return plan.micro_batches * int(sum(sym.Evaluator(exprs)(values))) if exprs else 0


def ranks_matmul_flops(result, exclude=()) -> int:
    """Matmul FLOPs summed over every rank of the job, from its programs (nodes whose name
    contains one of ``exclude`` left out)."""
    total = 0
    for program in result.job.programs:
        per_rank = sum(n.kernel.matmul_flops for n in program.nodes if n.kernel is not None
                       and not _matching(n.name, exclude))
        total += per_rank * len(program.ranks)
    return total


def assert_param_count(host: PluginHost, model: str, total: int, active: int | None = None, overrides=None) -> None:
    """The model's parameter count (and active count: what one token uses) equals the published one."""
    from .flow import model_graphs, resolve_model
    from .models import param_counts

    spec, config = resolve_model(host, model, overrides)
    forward, _ = model_graphs(spec, config, Plan())
    got_total, got_active = param_counts(forward)
    assert got_total == total, f"{model}: {got_total:,} parameters, expected {total:,} ({got_total - total:+,})"
    if active is not None:
        assert got_active == active, f"{model}: {got_active:,} active parameters, expected {active:,}"


def assert_forward_flops(host: PluginHost, model: str, expected: int, *, seq_len: int | None = None,
                         micro_batch_size: int = 1, overrides=None, what: str = "matmul_flops") -> None:
    """FLOPs (``what``: matmul_flops, flops, other_flops) of one forward of ``micro_batch_size``
    sequences of ``seq_len`` tokens equal ``expected``."""
    from .flow import model_graphs, resolve_model
    from .models import step_values, total

    spec, config = resolve_model(host, model, overrides)
    forward, _ = model_graphs(spec, config, Plan())
    seq_len = seq_len or forward.meta.get("seq_len") or getattr(config, "seq_len", None)
    got = total(forward, what, step_values(forward, micro_batch_size, seq_len))
    assert got == expected, f"{model}: forward {what} {got:,}, expected {expected:,} ({got - expected:+,})"


def assert_config_round_trips(host: PluginHost, family: str) -> None:
    """Every preset of ``family``: ``from_dict(to_dict())`` gives it back, and ``--set`` of a
    field to its own value changes nothing."""
    from .flow import resolve_model

    spec = host.family(family)
    assert spec.presets, f"family {family} registers no preset"
    for name, config in spec.presets.items():
        assert spec.from_dict(config.to_dict()) == config, f"{name}: from_dict(to_dict()) differs"
        fields = config.to_dict()
        key = next((k for k, v in fields.items() if isinstance(v, int) and not isinstance(v, bool)), None)
        if key is not None:
            _, same = resolve_model(host, name, {key: str(fields[key])})
            assert same == config, f"{name}: --set {key}={fields[key]} changed the config"


def matrix_plans(host: PluginHost) -> list[Plan]:
    """The strategy matrix (:func:`strategy_matrix`), keeping the plans whose strategies the host has."""
    from .flow import REQUESTED

    have = {s.name for s in host.strategies()}
    return [p for p in strategy_matrix() if all(name in have for name, asked in REQUESTED.items() if asked(p))]


def assert_flops_conserved(host: PluginHost, model: str, plans=None, overrides=None, replicated=()) -> int:
    """For every plan (default: the strategy matrix the host's strategies allow), the matmul
    FLOPs summed over ranks equal the one-device step, except ops whose name contains one of
    ``replicated`` (what the model declares every rank of a group computes whole).  Plans the
    model cannot take (a UsageError, e.g. a degree that does not divide) are passed over;
    returns how many plans were checked."""
    from .errors import UsageError

    plans = matrix_plans(host) if plans is None else plans
    if not plans:
        _skip("no parallel strategy is installed (install stage-parallel to run the matrix)")
    checked = 0
    for plan in plans:
        extra = dict(overrides or {})
        if plan.virtual_stages > 1 or plan.pp > 1:
            extra.update(matrix_overrides(plan) if model == "toy" else {})
        try:
            result = _plan(host, model, plan, extra)
        except UsageError:
            continue
        got, want = ranks_matmul_flops(result, replicated), one_device_matmul_flops(result, replicated)
        assert got == want, f"{model} {plan_id(plan)}: ranks compute {got:,} matmul FLOPs, one device {want:,}"
        checked += 1
    assert checked, f"{model}: no plan of the matrix is valid for it"
    return checked


def assert_tasks(host: PluginHost, model: str, overrides=None) -> dict[str, str]:
    """Every task (train, prefill, decode) either plans or refuses in one line (a UsageError
    or a PluginFault without a line break); returns what each did."""
    from .errors import StageError
    from .tasks import DECODE, PREFILL, TRAIN

    out = {}
    for task in (TRAIN, PREFILL, DECODE):
        try:
            _plan(host, model, Plan(task=task), overrides, programs=False)
            out[task] = "ok"
        except StageError as exc:
            text = str(exc)
            assert text and "\n" not in text, f"{model} --task {task}: a refusal of more than one line: {text!r}"
            out[task] = text
    return out


def assert_tp_shards_or_warns(host: PluginHost, model: str, overrides=None) -> str:
    """With ``--tp 2`` the model is sharded over tp, or the plan warns that nothing is."""
    from .errors import UsageError

    if "tp" not in {s.name for s in host.strategies()}:
        _skip("no tp strategy is installed (install stage-parallel)")
    try:
        result = _plan(host, model, Plan(tp=2), overrides, programs=False)
    except UsageError as exc:
        return f"refused: {exc}"
    sharded = any("tp" in layout for layout in result.sharded.param_compute.values())
    warned = any(w.startswith("--tp 2:") for w in result.warnings)
    assert sharded or warned, f"{model}: --tp 2 shards no parameter and says nothing"
    return "sharded" if sharded else "warned"


#: (pp, micro-batches, chunks) the schedule checks run
SCHEDULE_CASES = ((2, 1, 1), (2, 4, 1), (4, 4, 1), (4, 8, 1), (4, 16, 1), (8, 8, 1), (2, 4, 2), (4, 8, 2))


def assert_schedule_structure(host: PluginHost, schedule: str, cases=SCHEDULE_CASES, options=None) -> int:
    """The schedule's orders have the structure the host requires (stage_core.schedule.steps)
    for every case its chunks allow, with its ``options`` (keyword arguments of its order, by
    ``dest``); returns how many cases ran."""
    from .schedule.steps import order_problem

    spec = next((s for s in host.schedules() if s.name == schedule), None)
    assert spec is not None, f"no schedule {schedule!r} is registered"
    ran = 0
    for pp, m, v in cases:
        if spec.chunks is not None and v != spec.chunks:
            continue
        try:
            order = spec.order(pp, m, v, **(options or {}))
        except Exception as exc:  # noqa: BLE001 - a schedule may refuse a case (a UsageError) but not crash
            from .errors import UsageError

            assert isinstance(exc, UsageError), f"{schedule} pp{pp} m{m} v{v}: {type(exc).__name__}: {exc}"
            continue
        problem = order_problem(order, pp, m, v, spec.placement)
        assert problem is None, f"{schedule} pp{pp} m{m} v{v}: {problem}"
        ran += 1
    assert ran, f"{schedule}: took none of the cases {cases}"
    return ran


def _pipeline_bytes(result) -> list[int]:
    return [sum(n.comm_size for n in p.nodes if n.type in (NodeType.COMM_SEND, NodeType.COMM_RECV)
                and ":ring" not in n.name) for p in result.job.programs]


def assert_schedule_like_1f1b(host: PluginHost, schedule: str, directory: Path, model: str = "toy",
                              plans=None, overrides=None) -> list[dict]:
    """On each pipelined plan (default pp 2 and 4 with 4 and 8 micro-batches) the schedule
    gives every rank the same FLOPs and pipeline bytes as 1F1B on the same plan (for a
    schedule of 2 chunks a stage, as interleaved 1F1B with 2 virtual stages; for the "v"
    placement, the same FLOPs over the job; for "dual", DualPipe's two copies, each rank
    what 1F1B's stages s and p − 1 − s do for the micro-batches of each direction: with half
    each way, the mean of the two), its set
    validates and every rank finishes in the replay of the simulator's rules, and in a
    simulator where one is installed and available.  A schedule that runs the plan's
    ``--virtual-stages`` (``chunks`` None) runs each plan's; a plan may set the schedule's
    options (``plan.with_options``).  Returns per plan what was compared."""
    from .flow import write_trace_set
    from .schedule.steps import copies, flat_steps
    from .validate import examine

    spec = next(s for s in host.schedules() if s.name == schedule)
    plans = plans or [Plan(pp=pp, micro_batches=m, dp=1) for pp, m in ((2, 4), (4, 8))]
    simulators = [s for s in host.simulators() if s.available() is None]
    out = []
    for i, plan in enumerate(plans):
        chunks = spec.chunks // copies(spec.placement) if spec.chunks is not None else plan.virtual_stages
        plan = plan.replace(schedule=schedule, virtual_stages=chunks)
        layers = {"layers": str(plan.pp * chunks * 2)} if model == "toy" else {}
        extra = {**layers, **(overrides or {})}
        mine = _plan(host, model, plan, extra)
        base_plan = plan.replace(schedule="interleaved" if chunks > 1 else "1f1b").with_options(
            **{o.name: None for o in spec.options})
        if chunks > 1 and base_plan.micro_batches % base_plan.pp:
            base_plan = base_plan.replace(micro_batches=plan.pp * -(-plan.micro_batches // plan.pp))
        base = _plan(host, model, base_plan, extra)
        if spec.placement == "dual":
            # per stage, the micro-batches of each copy (direction), from the order the set ran
            order = spec.order(plan.pp, plan.micro_batches, 2, **{o.dest: plan.option(o.name, o.default)
                                                                  for o in spec.options})
            ways = [[len({m for k, m, c in flat_steps(steps) if k == "F" and c == copy}) for copy in (0, 1)]
                    for steps in order]
            p, n = plan.pp, plan.micro_batches
            for what, a, b in (("matmul FLOPs", [rc["flops"]["matmul"] for rc in mine.manifest["rank_classes"]],
                                [rc["flops"]["matmul"] for rc in base.manifest["rank_classes"]]),
                               ("pipeline bytes", _pipeline_bytes(mine), _pipeline_bytes(base))):
                want = [ways[s][0] * b[s] + ways[s][1] * b[p - 1 - s] for s in range(p)]  # n times a rank's
                assert [x * n for x in a] == want, (f"{schedule} {plan_id(plan)}: {what} per stage {a}, from 1F1B's "
                                                    f"{b}: {[w / n for w in want]}")
        for key in ("matmul", "other"):
            a = [rc["flops"][key] for rc in mine.manifest["rank_classes"]]
            b = [rc["flops"][key] for rc in base.manifest["rank_classes"]]
            if base_plan.micro_batches != plan.micro_batches:
                continue
            if spec.placement == "loop":
                assert sorted(a) == sorted(b), f"{schedule} {plan_id(plan)}: {key} FLOPs per stage {a}, 1F1B {b}"
            elif key == "matmul" and spec.placement != "dual":  # another placement puts other chunks together on a stage: the job's matmuls
                # are the same (a tied embedding on one stage is updated once, not on two: fewer other FLOPs)
                assert sum(a) == sum(b), f"{schedule} {plan_id(plan)}: {key} FLOPs {sum(a)}, 1F1B {sum(b)}"
        if base_plan.micro_batches == plan.micro_batches and spec.placement == "loop":
            assert _pipeline_bytes(mine) == _pipeline_bytes(base), (
                f"{schedule} {plan_id(plan)}: pipeline bytes per stage {_pipeline_bytes(mine)}, "
                f"1F1B {_pipeline_bytes(base)}")
        target = write_trace_set(host, mine, Path(directory) / f"{schedule}-{i}", _a_backend(host))
        from .flow import read_trace_set

        report = examine(read_trace_set(host, target))
        assert report.problems == [], report.problems[:3]
        assert report.verdict.finishes, f"{schedule} {plan_id(plan)}: ranks {report.verdict.unfinished} never finish"
        row = {"plan": plan_id(plan), "replay": "finishes"}
        for sim in simulators:
            got = sim.simulate(target, None)
            assert got["finished"], f"{schedule} {plan_id(plan)}: not every rank finished in {sim.name}"
            row[sim.name] = got["step_time_s"]
        out.append(row)
    return out


def _a_backend(host: PluginHost) -> str:
    names = [b.name for b in host.backends() if b.read is not None]
    if "chakra" in names:
        return "chakra"
    assert names, "no trace backend with a reader is installed (the kit's jsonl_plugin has one)"
    return names[0]


def assert_strategy_conserves(host: PluginHost, strategy: str, model: str = "toy", plans=None,
                              option: tuple[str, object] | None = None, overrides=None) -> int:
    """The strategy matrix (or ``plans``) with the strategy asked for (``option``: one of its
    options set) and without: FLOPs summed over ranks equal the one-device step either way,
    and every rank's memory adds up from its parts; with an option, the plan (and so the
    manifest and any sweep key) differs.  Returns how many plans ran."""
    from .errors import UsageError

    spec = next((s for s in host.strategies() if s.name == strategy), None)
    assert spec is not None, f"no strategy {strategy!r} is registered"
    plans = matrix_plans(host) if plans is None else plans
    ran = 0
    for plan in plans:
        variants = [plan] + ([plan.with_options(**{option[0].replace("-", "_"): option[1]})] if option else [])
        results = []
        for p in variants:
            try:
                result = _plan(host, model, p, {**(matrix_overrides(p) if model == "toy" else {}), **(overrides or {})})
            except UsageError:
                break
            got, want = ranks_matmul_flops(result), one_device_matmul_flops(result)
            assert got == want, f"{strategy} {plan_id(p)} {dict(p.options)}: ranks {got:,} matmul FLOPs, one device {want:,}"
            for rc in result.manifest["rank_classes"]:
                mem = rc["memory_bytes"]
                parts = sum(v for k, v in mem.items() if k != "total")
                assert mem["total"] == parts, f"{strategy} {plan_id(p)}: memory total {mem['total']} != parts {parts}"
            results.append(result)
        if len(results) == 2:
            assert results[0].manifest["plan"] != results[1].manifest["plan"], f"{strategy}: option {option} left " \
                                                                              f"the plan's manifest unchanged"
        ran += bool(results)
    assert ran, f"{strategy}: no plan ran"
    return ran


def assert_backend_round_trip(host: PluginHost, backend: str, directory: Path, model: str = "toy",
                              plans=(Plan(dp=2), Plan(pp=2, micro_batches=4), Plan(tp=2, dp=2))) -> int:
    """The backend writes sets its own reader reads back node for node, and validate passes
    them; returns the ranks checked."""
    from .flow import read_trace_set, write_trace_set
    from .validate import examine

    spec = next((b for b in host.backends() if b.name == backend), None)
    assert spec is not None and spec.read is not None, f"backend {backend!r} with a reader is not registered"
    have = {s.name for s in host.strategies()}
    checked = 0
    for i, plan in enumerate(plans):
        if any(n not in have for n, d in (("dp", plan.dp), ("pp", plan.pp), ("tp", plan.tp)) if d > 1):
            continue
        result = _plan(host, model, plan)
        target = write_trace_set(host, result, Path(directory) / f"{backend}-{i}", backend)
        trace_set = read_trace_set(host, target)
        ranks = dict(trace_set.iter_ranks())
        assert sorted(ranks) == list(range(plan.world_size))
        for program in result.job.programs:
            for rank in program.ranks:
                nodes = ranks[rank]
                assert [n.id for n in nodes] == [n.id for n in program.nodes], f"{backend}: rank {rank}'s node ids"
                assert [n.name for n in nodes] == [n.name for n in program.nodes], f"{backend}: rank {rank}'s names"
                checked += 1
        report = examine(read_trace_set(host, target))
        assert report.problems == [], report.problems[:3]
    if not checked:
        _skip("no strategy for the round-trip plans is installed (stage_core.testing.reference_strategies has dp, pp)")
    return checked


def assert_hardware_preset(host: PluginHost, name: str) -> dict[str, float]:
    """A hardware preset: positive datasheet figures, a source for each, a registered compute
    model that times kernels no faster than the roofline (FLOPs at peak, bytes at HBM speed)
    and slower for more work.  Returns the times of the three kernels it tried."""
    import math

    from .kernel import kernel

    hw = host.hardware_preset(name)
    gpu = hw.gpu
    for what, value in (("hbm_gbps", gpu.hbm_gbps), ("vector_tflops", gpu.vector_tflops), ("sm_count", gpu.sm_count),
                        ("scale_up bandwidth", hw.scale_up.bandwidth_gbps),
                        ("scale_out bandwidth", hw.scale_out.bandwidth_gbps), ("gpus_per_node", hw.gpus_per_node)):
        assert value > 0 and math.isfinite(value), f"{name}: {what} is {value}"
    assert all(v > 0 for v in gpu.matmul_tflops.values()), f"{name}: matmul_tflops {dict(gpu.matmul_tflops)}"
    unsourced = [f for f in ("matmul_tflops", "hbm_gbps") if f not in gpu.sources]
    assert not unsourced, f"{name}: no source for {', '.join(unsourced)} (GpuSpec.sources)"
    model = host.compute_model(gpu.compute_model, gpu.name)
    out = {}
    for n in (1024, 4096, 8192):
        gemm = kernel("einsum", "", "forward", "mk,kn->mn", {"m": n, "k": n, "n": n}, "bf16",
                      flops=2 * n ** 3, matmul_flops=2 * n ** 3, nbytes=3 * n * n * 2)
        seconds = model.time(gemm, gpu)
        floor = max(gemm.matmul_flops / gpu.peak_flops("bf16"), gemm.bytes / (gpu.hbm_gbps * 1e9))
        assert math.isfinite(seconds) and seconds >= floor * (1 - 1e-9), (
            f"{name}: a {n}^3 GEMM takes {seconds:.3e} s, faster than the roofline's {floor:.3e} s")
        out[f"gemm{n}"] = seconds
    assert out["gemm1024"] < out["gemm4096"] < out["gemm8192"], f"{name}: more work is not slower: {out}"
    return out


def assert_executor(host: PluginHost, name: str, options=None) -> int:
    """An executor runs a module-level function over plain items and yields every
    ``(index, result)`` exactly once, whatever the order; returns the items run."""
    spec = next((e for e in host.executors() if e.name == name), None)
    assert spec is not None, f"no executor {name!r} is registered"
    items = [{"n": n} for n in range(7)]
    got = dict(spec.run(_square, items, dict(options or {})))
    assert got == {i: i * i for i in range(7)}, f"executor {name}: {got}"
    return len(got)


def _square(item):
    return item["n"] ** 2


def assert_simulator(host: PluginHost, name: str, directory: Path, model: str = "toy",
                     plan: Plan = Plan(dp=2)) -> float:
    """A simulator runs a set STAGE wrote and says every rank finished, with a positive step
    (skips, saying why, when it cannot run here).  Returns the step in seconds."""
    from .flow import write_trace_set

    spec = next((s for s in host.simulators() if s.name == name), None)
    assert spec is not None, f"no simulator {name!r} is registered"
    reason = spec.available()
    if reason:
        _skip(f"simulator {name}: {reason}")
    writers = [b.name for b in host.backends() if b.name in spec.formats]
    if not writers:
        _skip(f"simulator {name} reads {', '.join(spec.formats)} sets, and no installed backend writes one")
    result = _plan(host, model, plan)
    target = write_trace_set(host, result, Path(directory) / f"{name}-set", writers[0])
    got = spec.simulate(target, None)
    assert got["finished"], f"simulator {name}: not every rank finished"
    assert got["step_time_s"] > 0, f"simulator {name}: step {got['step_time_s']}"
    return got["step_time_s"]


def assert_estimator(host: PluginHost, name: str, hardware=None, model: str = "toy") -> float:
    """An estimator times a one-GPU plan no faster than its kernels run one after the other
    (a GPU runs one kernel at a time: the sum of the program's ``duration_micros``, within
    the half microsecond their rounding may lose), and two micro-batches slower than one;
    node times, where it gives them, are one start and one finish per node of each rank
    class, the last finish being the step.  ``hardware``: a preset name or a
    :class:`HardwareSpec` (default: the host's first preset; skips without one).  Returns
    the one-micro-batch step in seconds."""
    import math

    spec = next((e for e in host.estimators() if e.name == name), None)
    assert spec is not None, f"no estimator {name!r} is registered"
    if hardware is None:
        presets = host.hardware()
        if not presets:
            _skip("no hardware preset is installed (stage-hardware registers h100 and a100)")
        hardware = presets[0]
    hw = host.hardware_preset(hardware) if isinstance(hardware, str) else hardware
    steps = []
    for m in (1, 2):
        result = _plan(host, model, Plan(micro_batches=m), gpu=hw)
        got = spec.estimate(result, hw)
        step = got["step_time_s"]
        assert isinstance(step, float) and math.isfinite(step) and step > 0, f"estimator {name}: step {step!r}"
        [program] = result.job.programs
        serial = (sum(n.duration_micros for n in program.nodes) - 0.5) * 1e-6
        assert step >= serial, (f"estimator {name}: {m} micro-batch(es) of {model} take {step:.6e} s on one "
                                f"{hw.name}, less than its kernels one after the other ({serial:.6e} s)")
        for key in ("node_start_s", "node_finish_s"):
            if key in got:
                times = [list(t) for t in got[key]]
                assert [len(t) for t in times] == [len(program.nodes)], (
                    f"estimator {name}: {key} has {[len(t) for t in times]} values, the program "
                    f"{len(program.nodes)} nodes")
        if "node_finish_s" in got:
            last = max(got["node_finish_s"][0])
            assert math.isclose(last, step, rel_tol=1e-9), f"estimator {name}: last node at {last}, step {step}"
            assert all(f >= s for s, f in zip(got.get("node_start_s", [[]])[0], got["node_finish_s"][0]))
        steps.append(step)
    assert steps[1] > steps[0], f"estimator {name}: two micro-batches ({steps[1]} s) are no slower than one"
    return steps[0]
