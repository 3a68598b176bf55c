"""The plugin's hooks, the config's validation, the Mamba layer's layout and how tensor
parallel splits it."""

from __future__ import annotations

from collections import Counter
from importlib.metadata import entry_points

import pytest
from stage_core.api import (CollectiveType as C, Plan, Replicate, Shard, StrategySpec, UsageError, hookimpl, plan_job,
                            sym)
from stage_core.records import ModelSpec
from stage_core.testing import fresh_host

from stage_model_ssm import PRESETS, HybridConfig, build, plugin
from stage_model_ssm.hf import to_hf


def test_five_families():
    (specs,) = fresh_host((plugin, "ssm")).pm.hook.stage_models()
    by_family = {s.family: s for s in specs}
    assert set(by_family) == {"mamba2", "nemotron_h", "mamba", "jamba", "zamba2"}
    assert set(by_family["mamba2"].presets) == {"mamba2-tiny", "mamba2-2.7b"}
    assert set(by_family["nemotron_h"].presets) == {"hybrid-tiny", "nemotron-h-8b"}
    assert set(by_family["mamba"].presets) == {"mamba1-tiny", "falcon-mamba-7b"}
    assert set(by_family["jamba"].presets) == {"jamba-tiny", "jamba-v0.1"}
    assert set(by_family["zamba2"].presets) == {"zamba2-tiny", "zamba2-1.2b", "zamba2-2.7b", "zamba2-7b"}
    for spec in specs:
        assert isinstance(spec, ModelSpec) and spec.family in spec.hf_model_types
        for name, c in spec.presets.items():
            assert c.name == name and c.family == spec.family and spec.from_dict(c.to_dict()) == c


def test_hooks_and_entry_point():
    host = fresh_host((plugin, "ssm"))
    assert host.config_from_hf(to_hf(PRESETS["mamba2-2.7b"])) == PRESETS["mamba2-2.7b"]
    # the keys decide: a layer pattern is a hybrid whatever the model_type
    hybrid = {**to_hf(PRESETS["nemotron-h-8b"]), "model_type": "some-hybrid"}
    assert host.config_from_hf(hybrid) == PRESETS["nemotron-h-8b"]
    # a Zamba2 layer list with shared blocks is Zamba2 whatever the model_type (nemotron_h
    # reads a layers_block_type too)
    zamba = {**to_hf(PRESETS["zamba2-7b"]), "model_type": "some-hybrid"}
    assert host.config_from_hf(zamba) == PRESETS["zamba2-7b"]
    with pytest.raises(UsageError, match="no model family reads it"):
        host.config_from_hf({"model_type": "gemma2", "hidden_size": 8})
    assert {ep.name: ep.value for ep in entry_points(group="stage")}.get("ssm") == "stage_model_ssm.plugin"


def test_mamba_layer_layout():
    g = build(PRESETS["hybrid-tiny"])
    names = [op.name.removeprefix("layers.0.") for op in g.ops if op.layer == 0]
    assert names == ["mamba.norm", "mamba.in_proj", "mamba.in_split", "mamba.conv1d", "mamba.conv_split", "mamba.ssd",
                     "mamba.norm_gated", "mamba.out_proj", "mamba.residual"]
    params = {p.name.removeprefix("layers.0.mamba."): tuple(sym.evaluate(e, g.dims) for e in p.shape)
              for p in g.params if p.name.startswith("layers.0.")}
    # 8 heads of 32 in 2 groups (4 heads each), state 16, 4 taps: e = 2·4·32 + 2·16 + 4 per group
    assert params == {"norm.weight": (128,), "in_proj.weight": (128, 2, 292), "conv1d.weight": (2, 160, 4),
                      "conv1d.bias": (2, 160), "A_log": (2, 4), "D": (2, 4), "dt_bias": (2, 4),
                      "norm_gated.weight": (2, 4, 32), "out_proj.weight": (2, 4, 32, 128)}
    assert {p.name: p.dtype for p in g.params if p.name.startswith("layers.0.mamba.")}["layers.0.mamba.A_log"] == "fp32"
    kinds = [op.name.split(".")[2] for op in g.ops if op.layer is not None and op.name.endswith("residual")]
    assert kinds == ["mamba", "attn", "mlp", "moe"] * 2


def test_pattern_kinds():
    c = PRESETS["nemotron-h-8b"]
    assert (len(c.layer_indices("mamba")), len(c.layer_indices("mlp")), len(c.layer_indices("attention"))) == (24, 24, 4)
    assert c.layers == 52 and build(c).meta["layers"] == 52


class _TensorParallel:
    """A throwaway tp (and sp) strategy declaring what stage-parallel's does, so the model's
    layout is tested with the core alone."""

    @staticmethod
    def apply(sg, mesh, plan):
        if plan.tp > 1:
            sg.shard_params("tp", ("g", "mg", "f", "fe", "V"))
            sg.hint("residual", "tp", Shard("s") if plan.sp else Replicate())
        return sg

    @hookimpl
    def stage_strategies(self):
        return [StrategySpec("tp", "tp", lambda model, plan: [], self.apply),
                StrategySpec("sp", None, lambda model, plan: [], lambda sg, mesh, plan: sg)]


def lowered(plan: Plan, c):
    host = fresh_host((plugin, "ssm"), (_TensorParallel(), "tp"))
    return plan_job(host, "mamba2-tiny", {"ssm_groups": str(c.ssm_groups)}, plan).lowered


def mamba_colls(low):
    return [n for n in low.programs[0].nodes if n.comm_type is not None and ".layers.0." in n.name]


def test_tensor_parallel_shards_heads_and_groups_with_one_reduction_per_direction():
    c = PRESETS["mamba2-tiny"].replace(ssm_groups=2)
    low = lowered(Plan(tp=2, seq_len=256), c)
    # in_proj column parallel, out_proj row parallel: the forward all-reduces out_proj's
    # output, the backward in_proj's input gradient, both [b, s, h] bf16
    assert Counter((n.comm_type, n.comm_size) for n in mamba_colls(low)) == {(C.ALL_REDUCE, 256 * 128 * 2): 2}
    # each rank runs half the heads: the scan's FLOPs halve
    full = lowered(Plan(tp=1, seq_len=256), c)
    ssd = lambda low: sum(n.num_ops for n in low.programs[0].nodes if n.name.endswith("layers.0.mamba.ssd"))  # noqa
    assert 2 * ssd(low) == ssd(full)


def test_sequence_parallel_gathers_before_in_proj_and_scatters_after_out_proj():
    c = PRESETS["mamba2-tiny"].replace(ssm_groups=2)
    low = lowered(Plan(tp=2, sp=True, seq_len=256), c)
    # forward: gather the norm's s/t tokens for in_proj, reduce-scatter out_proj's output;
    # backward: gather the output gradient, reduce-scatter in_proj's input gradient, and
    # gather in_proj's input again for its weight gradient (Megatron keeps only its shard)
    kinds = Counter(n.comm_type for n in mamba_colls(low))
    assert kinds == {C.ALL_GATHER: 3, C.REDUCE_SCATTER: 2}


@pytest.mark.parametrize("change,field", [
    ({"pattern": "MX"}, "pattern"),
    ({"pattern": ""}, "pattern"),
    ({"family": "zamba"}, "family"),
    ({"ssm_version": 3}, "ssm_version"),
    ({"blocks_per_layer": 3}, "pattern"),
    ({"ssm_groups": 3}, "ssm_groups"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"mlp_act": "gelu"}, "mlp_act"),
    ({"router_score": "argmax"}, "router_score"),
    ({"experts_per_token": 9}, "experts_per_token"),
    ({"kv_heads": 3}, "kv_heads"),
    ({"seq_len": 4096}, "seq_len"),
])
def test_invalid_configs_name_the_field(change, field):
    with pytest.raises(UsageError, match=field):
        PRESETS["hybrid-tiny"].replace(**change)


def test_overrides():
    c = PRESETS["hybrid-tiny"].with_overrides({"pattern": "MM*-", "chunk_size": "32"})
    assert c.layers == 4 and c.chunk_size == 32 and HybridConfig.from_dict(c.to_dict()) == c
