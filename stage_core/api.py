"""STAGE's public API: everything a plugin may import, and nothing else.

A plugin imports from here (``from stage_core.api import GraphBuilder, ModelSpec``),
from :mod:`stage_core.records` and :mod:`stage_core.testing`, and ``hookimpl`` from
``stage_core``.  Every other module of ``stage_core`` is internal and may change
between releases; ``tests/core/test_public_api.py`` fails when an in-tree plugin or
adapter imports anything else.  ``docs/plugins.md`` is the guide.

Sections, in the order a plugin meets them:

* the hook marker and the records plugins register;
* errors (a plugin raises :class:`UsageError` for a user's mistake);
* models: the config base class and its checks, config.json reading, the graph
  builder, the standard blocks, dims (``sym``) and parameter counts;
* kernels: the registry a model plugin adds kernels through, and what a compute model
  sees of one kernel;
* strategies: placements, the sharded graph, the mesh;
* plans: :class:`Plan`, settings to plans, the plan flags of plugin commands;
* grids of plans (:mod:`stage_core.grid`) and their units of work, named by content
  and kept in a cache folder (:mod:`stage_core.unitcache`);
* the flow: planning a job, writing, reading and validating a trace set;
* files: the one output rule every written file follows, bounded reading of inputs;
* traces: what a backend writes and reads;
* hardware and estimation: presets, transfer times, the replay engine, ASTRA-sim's
  analytical network and a step's breakdown (``netmodel``);
* showing results: units, plain tables, a rank's memory beside its GPU, progress.
"""

from __future__ import annotations

from . import __version__, grid, hardware, netmodel, sym
from .autodiff import OptimizerConfig, differentiate
from .bounds import MAX_WORLD
from .cli import main
from .ir import kernels as flop_counts
from .errors import OutputError, PluginError, StageError, TraceError, TraceReadError, TraceWriteError, UsageError
from .flow import (Result, check_output_dir, comm_groups_json, open_trace_set, plan_job, read_manifest,
                   read_trace_set, resolve_model, write_trace_set)
from .inputs import read_input, read_json, read_text
from .output import (check_output_file, die_with_parent, png_metadata, recognized, scratch_folder, stage_mark,
                     write_figure, write_output, write_output_folder)
from .hookspecs import hookimpl
from .ir import blocks
from .ir.blocks import ATTENTION_KINDS, GLU_KINDS, RESIDUAL
from .ir.builder import GraphBuilder
from .ir.graph import Graph
from .ir.ops import BACKWARD, FORWARD, MATMUL, OPTIMIZER, OTHER, Op
from .ir.tensor import DTYPE_BYTES, Role, Tensor
from .kernel import Gemm, Kernel, kernel
from .kernels import STANDARD as STANDARD_KERNELS
from .kernels import Grads, KernelCall, KernelDef, KernelSpec
from .models import (DTYPES, PLAN_DIMS, HFKeys, HFReader, ModelConfig, check_at_most, check_bool, check_choice,
                     check_divides, check_int, check_positive_number, check_str, evaluate_sum, flops_by_layer,
                     hf_import_of, layer_kinds, load_hf_config, padded, param_counts, saved_bytes_per_layer, step_values, total, training_flops)
from .parallel.lower import Timing
from .parallel.mesh import Mesh
from .parallel.moe import expert_tensors
from .parallel.overlap import MIN_PIECE_BYTES, WINDOW_USE
from .parallel.placement import FLAT, Partial, Replicate, Shard, ShardedGraph
from .parallel.plan import AXES, DEFAULT_ORDER, Plan, divisors
from .parallel.split import balanced_split
from .planning import (DEFAULT_MODEL, DEFAULT_PLAN, PlanRequest, add_gpu_flag, add_plan_flags, plan_from_args, plan_from_flags,
                       plan_from_settings, setting_names, settings_flags)
from .plugins import PluginHost
from .progress import Progress, add_quiet_flag
from .rankset import parse_ranks, ranks_text
from .reporting import GiB, binary_unit, fit_line, gib, memory_fit, memory_text, ranks_range, si_text, si_unit, table
from .records import (AxisSpec, BackendSpec, CommandSpec, ComputeModelSpec, EstimatorSpec, ExecutorSpec, GpuSpec,
                      HardwareSpec, LinkSpec, ModelSpec, OptionSpec, PlanSpec, ScheduleSpec, SimulatorSpec, StrategySpec)
from .schedule.orders import gpipe, interleaved_1f1b, one_f_one_b
from .schedule.steps import STEP_KINDS, Step, flat_steps, is_pair, order_problem, simulate_order
from .serve import plan_serve
from .tasks import CONTEXT, DECODE, PREFILL, TRAIN, inference_graph
from .trace import (COMM_KEYS, RANK_ATTRS, CollectiveType, NodeType, ProgramNode, RankProgram, StampedNodes, TraceJob,
                    TraceNode, TraceSet)
from .unitcache import UnitCache, code_versions, unit_id
from .validate import examine as examine_trace_set
from .validate import replay
from .validate import validate as validate_trace_set

__all__ = [
    # hooks and records
    "hookimpl", "__version__", "AxisSpec", "BackendSpec", "CommandSpec", "ComputeModelSpec", "EstimatorSpec",
    "ExecutorSpec", "GpuSpec", "HardwareSpec", "LinkSpec", "ModelSpec", "OptionSpec", "PlanSpec", "ScheduleSpec",
    "SimulatorSpec", "StrategySpec", "PluginHost",
    # errors
    "StageError", "UsageError", "PluginError", "OutputError", "TraceError", "TraceReadError", "TraceWriteError",
    # models
    "ModelConfig", "DTYPES", "check_at_most", "check_bool", "check_choice", "check_divides", "check_int",
    "check_positive_number", "check_str", "padded", "HFKeys", "HFReader", "hf_import_of", "layer_kinds",
    "load_hf_config", "GraphBuilder", "Graph", "Tensor",
    "Role", "Op", "DTYPE_BYTES", "FORWARD", "BACKWARD", "OPTIMIZER", "MATMUL", "OTHER", "blocks", "RESIDUAL",
    "ATTENTION_KINDS", "GLU_KINDS", "sym", "param_counts", "evaluate_sum", "step_values", "training_flops",
    "flops_by_layer", "saved_bytes_per_layer", "total", "PLAN_DIMS", "flop_counts",
    # tasks: the graph each task runs
    "differentiate", "OptimizerConfig", "inference_graph", "TRAIN", "PREFILL", "DECODE", "CONTEXT",
    # kernels
    "KernelSpec", "KernelDef", "KernelCall", "Grads", "Kernel", "Gemm", "kernel", "STANDARD_KERNELS",
    # strategies
    "Shard", "Replicate", "Partial", "FLAT", "ShardedGraph", "Mesh", "expert_tensors", "AXES", "DEFAULT_ORDER",
    "divisors", "balanced_split",
    # plans
    "Plan", "PlanRequest", "plan_from_settings", "plan_from_args", "plan_from_flags", "add_plan_flags", "add_gpu_flag",
    "setting_names", "settings_flags", "DEFAULT_MODEL", "DEFAULT_PLAN",
    # schedules
    "STEP_KINDS", "Step", "order_problem", "simulate_order", "flat_steps", "is_pair", "gpipe", "one_f_one_b",
    "interleaved_1f1b",
    # grids of plans (stage sweep, stage dataset) and their units of work
    "grid", "UnitCache", "unit_id", "code_versions",
    # the flow
    "Result", "plan_job", "resolve_model", "write_trace_set", "read_trace_set", "open_trace_set", "read_manifest",
    "check_output_dir", "comm_groups_json", "validate_trace_set", "examine_trace_set", "plan_serve", "main",
    "MAX_WORLD",
    # files: every file STAGE writes goes through write_output (or write_output_folder); inputs are read bounded
    "write_output", "write_output_folder", "write_figure", "check_output_file", "recognized", "stage_mark",
    "png_metadata",
    "scratch_folder", "die_with_parent", "read_input", "read_text", "read_json",
    # traces
    "NodeType", "CollectiveType", "COMM_KEYS", "ProgramNode", "RankProgram", "TraceJob", "TraceNode", "TraceSet",
    "StampedNodes", "RANK_ATTRS", "parse_ranks", "ranks_text",
    # hardware and estimation
    "hardware", "replay", "Timing", "MIN_PIECE_BYTES", "WINDOW_USE", "netmodel",
    # showing results: units (GiB for memory, SI for traffic and FLOPs), tables, the memory fit, progress
    "GiB", "gib", "memory_text", "binary_unit", "si_text", "si_unit", "ranks_range", "table", "memory_fit",
    "fit_line", "Progress", "add_quiet_flag",
]
