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
           "check_trace_set", "strategy_matrix", "matrix_overrides", "plan_id", "stage_host", "reference_strategies"]


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

    manifest = json.loads((directory / "manifest.json").read_text())
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
