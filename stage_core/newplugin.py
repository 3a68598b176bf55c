"""``stage new-plugin NAME --kind KIND``: a skeleton distribution that installs and passes as written.

Each kind's skeleton is a small working plugin written against the public API only
(:mod:`stage_core.api`, :mod:`stage_core.records`, :mod:`stage_core.testing`): a
``pyproject.toml`` with its entry point in the group ``stage``, a README, the plugin
module, and tests that use the conformance kit with numbers worked out by hand.
docs/plugins.md walks through what to change.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from .errors import UsageError

KINDS = ("model", "schedule", "strategy", "backend", "hardware")
_NAME = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")

_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "STAGE {kind} plugin: {name}"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["stage-core"]

[project.optional-dependencies]
test = ["pytest>=7"]

# STAGE finds the plugin here; the name is what `stage plugins` lists and STAGE_DISABLE_PLUGINS blocks
[project.entry-points.stage]
{name} = "{module}.plugin"

[tool.setuptools.packages.find]
include = ["{module}*"]

[tool.pytest.ini_options]
testpaths = ["tests"]
'''

_README = '''\
# {dist}

A STAGE {kind} plugin{what}.

    pip install .            # then: stage plugins    (lists "{name}")
    pip install .[test] && pytest

Written against STAGE's public API (`stage_core.api`, `stage_core.records`,
`stage_core.testing`); its tests use STAGE's conformance kit. See STAGE's
docs/plugins.md for what each hook expects and how to publish.
'''

_WHAT = {
    "model": ": the `{name}` family (a GPT-like decoder) and its preset `{name}-tiny`",
    "schedule": ": the `{name}` pipeline schedule (all forwards, then the backwards last first)",
    "strategy": ": the `{name}` strategy (data parallel; ZeRO-1 with `--{name}-sharded`)",
    "backend": ": the `{name}` trace format (one JSON node per line) with its reader",
    "hardware": ": the `{name}` hardware preset (an A100 80GB node) and its `{name}-roofline` compute model",
}

_PLUGINS = {
    "model": '''\
"""The {name} model family: a GPT-like decoder written once, for one device (STAGE's blocks)."""

import dataclasses

from stage_core.api import RESIDUAL, ModelConfig, ModelSpec, blocks, check_divides, check_int, hookimpl


@dataclasses.dataclass(frozen=True)
class Config(ModelConfig):
    name: str = "{name}-tiny"
    family: str = "{name}"
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    ffn: int = 512
    vocab: int = 512
    seq_len: int = 256
    dtype: str = "bf16"
    attention: str = "flash"
    causal_flops: bool = False

    def __post_init__(self):
        check_int(self, "layers", "hidden", "heads", "ffn", "vocab", "seq_len")
        check_divides(self, "heads", "hidden", "the head dim is hidden/heads")

    def dims(self) -> dict:
        # the dim names STAGE's strategies read: h, a (heads), g (KV heads), d, f, V
        return {{"h": self.hidden, "a": self.heads, "g": self.heads, "d": self.hidden // self.heads,
                 "f": self.ffn, "V": self.vocab}}


def build(c: Config):
    g = blocks.model_builder(c)
    x, labels, wte = blocks.embed(g)
    for i in range(c.layers):
        with g.layer(i):
            y = blocks.norm(g, x, "attn.norm", "layernorm", bias=True)
            x = g.add(blocks.gqa_attention(g, y, kind=c.attention, causal_flops=c.causal_flops), x,
                      name="attn.residual", tags=RESIDUAL)
            y = blocks.norm(g, x, "mlp.norm", "layernorm", bias=True)
            x = g.add(blocks.gelu_mlp(g, y), x, name="mlp.residual", tags=RESIDUAL)
    return blocks.lm_head(g, x, labels, wte, norm_kind="layernorm", norm_bias=True, tied=True)


@hookimpl
def stage_models():
    return [ModelSpec(name="{name}", family="{name}", build=build, presets={{"{name}-tiny": Config()}},
                      from_dict=Config.from_dict, description="a GPT-like decoder")]
''',
    "schedule": '''\
"""The {name} schedule: every forward, then every backward, the last micro-batch's first."""

from stage_core.api import ScheduleSpec, hookimpl


def order(stages: int, micro_batches: int, virtual: int = 1):
    """Per stage, the (kind, micro-batch, chunk) steps it runs in order."""
    forwards = [("F", m, 0) for m in range(micro_batches)]
    backwards = [("B", m, 0) for m in reversed(range(micro_batches))]
    return [forwards + backwards for _ in range(stages)]


@hookimpl
def stage_schedules():
    return [ScheduleSpec("{name}", order, "all forwards, then the backwards last first", chunks=1)]
''',
    "strategy": '''\
"""The {name} strategy: data parallel over the dp axis; with `--{name}-sharded` the gradients
are reduce-scattered and each rank keeps and updates only its shard of the optimizer state
(ZeRO stage 1, Rajbhandari et al. 2020), the updated parameters all-gathered back."""

from stage_core.api import FLAT, OptionSpec, Replicate, Shard, StrategySpec, hookimpl


def validate(model, plan):
    return []


def apply(sg, mesh, plan):
    if plan.dp > 1:
        sg.shard_inputs("dp", "b")  # each replica gets its own sequences
        if plan.option("{name}-sharded", False):
            sg.grad_target["dp"] = Shard(FLAT)  # reduce-scatter: each rank updates its shard
            sg.optimizer_sharded.add("dp")
        else:
            sg.grad_target["dp"] = Replicate()  # all-reduce once per step
    return sg


@hookimpl
def stage_strategies():
    return [StrategySpec("{name}", "dp", validate, apply, order=10, description="data parallel, optimizer sharded "
                         "by option", options=(OptionSpec("{name}-sharded", bool, False,
                                                           "shard the optimizer state over dp (ZeRO-1)"),))]
''',
    "backend": '''\
"""The {name} trace format: ``trace.<rank>.{name}.jsonl``, one JSON node per line, and its reader."""

import json
from pathlib import Path

from stage_core.api import BackendSpec, NodeType, TraceNode, TraceSet, hookimpl

SUFFIX = ".{name}.jsonl"


def _attrs(job, rank, node):
    attrs = {{"is_cpu_op": ["bool_val", False]}}
    if node.type == NodeType.COMP:
        attrs.update(num_ops=["int64_val", node.num_ops], tensor_size=["uint64_val", node.tensor_size])
    elif node.type == NodeType.COMM_COLL:
        attrs.update(comm_type=["int64_val", int(node.comm_type)], comm_size=["int64_val", node.comm_size])
        if node.group is not None:
            attrs["pg_name"] = ["string_val", job.group_name(rank, node.group)]
    else:
        side = "comm_dst" if node.type == NodeType.COMM_SEND else "comm_src"
        attrs.update({{side: ["int32_val", job.peer_rank(rank, node.peer)], "comm_tag": ["int32_val", node.tag],
                      "comm_size": ["int64_val", node.comm_size]}})
    return attrs


def write(job, out_dir):
    wanted = None if job.ranks is None else set(job.ranks)
    for program in job.programs:
        for rank in program.ranks:
            if wanted is not None and rank not in wanted:
                continue
            with open(Path(out_dir) / f"trace.{{rank}}{{SUFFIX}}", "w") as f:
                for n in program.nodes:
                    f.write(json.dumps({{"id": n.id, "name": n.name, "type": int(n.type), "data": list(n.data_deps),
                                        "ctrl": list(n.ctrl_deps), "attrs": _attrs(job, rank, n),
                                        "us": n.duration_micros}}) + "\\n")
            if job.progress is not None:
                job.progress(1)


def read(directory):
    directory = Path(directory)
    files = sorted(directory.glob(f"trace.*{{SUFFIX}}"), key=lambda p: int(p.name.split(".")[1]))

    def ranks():
        for path in files:
            nodes = []
            for line in path.read_text().splitlines():
                d = json.loads(line)
                nodes.append(TraceNode(d["id"], d["name"], d["type"], d["data"], d["ctrl"],
                                       {{k: tuple(v) for k, v in d["attrs"].items()}}, d["us"]))
            yield int(path.name.split(".")[1]), nodes

    groups = json.loads((directory / "comm_groups.json").read_text())
    return TraceSet(world_size=len(files), comm_groups=groups, iter_ranks=ranks)


@hookimpl
def stage_trace_backends():
    return [BackendSpec("{name}", write, read, detect=lambda d: any(Path(d).glob(f"trace.*{{SUFFIX}}")),
                        format_id="{name}-jsonl", description="one JSON node per line")]
''',
    "hardware": '''\
"""The {name} hardware preset (an A100 80GB SXM node, its datasheet figures) and a roofline
compute model of its own."""

from stage_core.api import ComputeModelSpec, GpuSpec, HardwareSpec, LinkSpec, hookimpl

DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (2021)"


def roofline(kernel, gpu):
    """Seconds: the larger of the FLOPs at the tensor-core peak and the bytes at HBM speed."""
    return max(kernel.matmul_flops / gpu.peak_flops(kernel.dtype) + (kernel.flops - kernel.matmul_flops)
               / (gpu.vector_tflops * 1e12), kernel.bytes / (gpu.hbm_gbps * 1e9))


@hookimpl
def stage_compute_models():
    return [ComputeModelSpec("{name}-roofline", roofline, description="FLOPs at peak or bytes at HBM speed")]


@hookimpl
def stage_hardware():
    gpu = GpuSpec(name="{name}", description="A100 SXM4 80GB", matmul_tflops={{"bf16": 312.0, "fp16": 312.0}},
                  vector_tflops=19.5, hbm_gbps=2039.0, sm_count=108, memory_gib=80.0,
                  compute_model="{name}-roofline",
                  sources={{"matmul_tflops": DATASHEET, "vector_tflops": DATASHEET, "hbm_gbps": DATASHEET,
                           "sm_count": "NVIDIA A100 architecture whitepaper", "memory_gib": DATASHEET}})
    return [HardwareSpec(name="{name}", description="8 x A100 80GB, NVLink 3, one HDR port per GPU", gpu=gpu,
                         gpus_per_node=8, scale_up=LinkSpec("NVLink 3", 300.0, 0.8, 1000.0),
                         scale_out=LinkSpec("InfiniBand HDR", 25.0, 0.8, 3000.0),
                         sources={{"scale_up": "NVLink 3: 600 GB/s per GPU both ways (datasheet)",
                                  "scale_out": "HDR: 200 Gb/s per port (DGX A100 user guide)"}})]
''',
}

_TESTS = {
    "model": '''\
"""The {name} family against STAGE's conformance kit, with numbers worked out by hand."""

from stage_core.testing import (assert_config_round_trips, assert_flops_conserved, assert_forward_flops,
                                assert_param_count, assert_tasks, fresh_host, jsonl_plugin, reference_strategies)

from {module} import plugin

HOST = fresh_host((plugin, "{name}"), (reference_strategies, "reference"), (jsonl_plugin, "jsonl"))
L, H, F, V, S = 2, 128, 512, 512, 256


def test_parameter_count_by_hand():
    # per layer: QKV and output projections 4h^2 (no biases), an MLP h->f->h 2hf with fc1's bias f, two layer
    # norms with biases 4h; the tied embedding V h; the final layer norm 2h
    assert_param_count(HOST, "{name}-tiny", L * (4 * H * H + 2 * H * F + F + 4 * H) + V * H + 2 * H)


def test_forward_flops_by_hand():
    # per layer: QKV 2·s·h·3h, scores and context 2·2·s²·h, output 2·s·h², MLP 2·2·s·h·f; the head 2·s·h·V
    per_layer = 2 * S * H * 3 * H + 4 * S * S * H + 2 * S * H * H + 4 * S * H * F
    assert_forward_flops(HOST, "{name}-tiny", L * per_layer + 2 * S * H * V)


def test_conformance():
    assert_config_round_trips(HOST, "{name}")
    assert assert_tasks(HOST, "{name}-tiny") == {{"train": "ok", "prefill": "ok", "decode": "ok"}}
    assert assert_flops_conserved(HOST, "{name}-tiny") >= 4
''',
    "schedule": '''\
"""The {name} schedule against STAGE's conformance kit."""

from stage_core.testing import (assert_schedule_like_1f1b, assert_schedule_structure, fresh_host, jsonl_plugin,
                                reference_strategies, toy_plugin)

from {module} import plugin
from {module}.plugin import order

HOST = fresh_host((plugin, "{name}"), (toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (reference_strategies, "ref"))


def test_the_order_by_hand():
    assert order(2, 2) == [[("F", 0, 0), ("F", 1, 0), ("B", 1, 0), ("B", 0, 0)]] * 2


def test_structure_and_like_1f1b(tmp_path):
    assert assert_schedule_structure(HOST, "{name}") >= 4
    rows = assert_schedule_like_1f1b(HOST, "{name}", tmp_path)
    assert [r["replay"] for r in rows] == ["finishes"] * len(rows)
''',
    "strategy": '''\
"""The {name} strategy against STAGE's conformance kit, with ZeRO's numbers."""

from stage_core.api import Plan, plan_job
from stage_core.testing import assert_strategy_conserves, fresh_host, jsonl_plugin, toy_plugin

from {module} import plugin

HOST = fresh_host((plugin, "{name}"), (toy_plugin, "toy"), (jsonl_plugin, "jsonl"))
PARAMS = 108_288  # the toy model: 2·(12h² + 13h) + Vh + 2h with h 64, V 128


def test_conserves_flops_with_and_without_its_option():
    assert assert_strategy_conserves(HOST, "{name}", plans=[Plan(dp=2), Plan(dp=4, micro_batches=2)],
                                     option=("{name}-sharded", True)) == 2


def test_optimizer_state_per_rank_is_zeros():
    # Rajbhandari et al. 2020: fp32 master, momentum and variance, 12 bytes a parameter, over N_d ranks
    for sharded, per_rank in ((False, 12 * PARAMS), (True, 12 * PARAMS // 4)):
        result = plan_job(HOST, "toy", {{}}, Plan(dp=4).with_options(**{{"{name}_sharded": sharded}}))
        assert [rc["memory_bytes"]["optimizer"] for rc in result.manifest["rank_classes"]] == [per_rank]
''',
    "backend": '''\
"""The {name} backend against STAGE's conformance kit."""

from stage_core.testing import assert_backend_round_trip, fresh_host, reference_strategies, toy_plugin

from {module} import plugin


def test_round_trip(tmp_path):
    host = fresh_host((plugin, "{name}"), (toy_plugin, "toy"), (reference_strategies, "reference"))
    assert assert_backend_round_trip(host, "{name}", tmp_path) == 2 + 2  # the dp 2 and pp 2 sets' ranks
''',
    "hardware": '''\
"""The {name} preset against STAGE's conformance kit."""

from stage_core.testing import assert_hardware_preset, fresh_host

from {module} import plugin


def test_preset():
    times = assert_hardware_preset(fresh_host((plugin, "{name}")), "{name}")
    # an 8192^3 bf16 GEMM: 2·8192³ FLOPs at 312 TFLOP/s
    assert abs(times["gemm8192"] - 2 * 8192**3 / 312e12) < 1e-9
''',
}


def write_skeleton(name: str, kind: str, out: str | None = None) -> Path:
    """Write the skeleton distribution of plugin ``name`` of ``kind`` into ``out`` (default
    ``./stage-<kind>-<name>``); refuses a folder that exists and is not empty."""
    if kind not in KINDS:
        raise UsageError(f"--kind {kind}: valid kinds are {', '.join(KINDS)}")
    if not _NAME.match(name):
        raise UsageError(f"new-plugin {name!r}: a plugin name is lowercase letters and digits, words joined by "
                         f"'-', starting with a letter (e.g. zero-bubble)")
    dist = f"stage-{kind}-{name}"
    module = dist.replace("-", "_")
    target = Path(out) if out else Path(dist)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UsageError(f"-o {target}: exists and is not an empty folder; give a new folder")
    fields = {"name": name, "kind": kind, "dist": dist, "module": module}
    files = {
        "pyproject.toml": _PYPROJECT.format(**fields),
        "README.md": _README.format(**fields, what=_WHAT[kind].format(**fields)),
        f"{module}/__init__.py": f'"""STAGE {kind} plugin {name}."""\n',
        f"{module}/plugin.py": _PLUGINS[kind].format(**fields),
        "tests/test_plugin.py": _TESTS[kind].format(**fields),
    }
    tmp = target.with_name(f".{target.name}.tmp-new-plugin")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    for rel, text in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text) if rel.endswith(".md") else text)
    if target.exists():
        target.rmdir()
    tmp.rename(target)
    return target
