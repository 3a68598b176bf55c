"""The plugin's hooks, the config's validation and the graph's layout conventions."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from stage_core.api import PLAN_DIMS, UsageError, sym
from stage_core.records import ModelSpec
from stage_core.testing import fresh_host

from stage_model_gpt import PRESETS, GPTConfig, build, plugin
from stage_model_gpt.hf import to_hf


def _manager():
    return fresh_host((plugin, "gpt")).pm


def test_stage_models_hook():
    (specs,) = _manager().hook.stage_models()
    (spec,) = specs
    assert isinstance(spec, ModelSpec)
    assert (spec.name, spec.family, spec.hf_model_types) == ("gpt", "gpt", ("gpt2",))
    assert spec.build is build
    assert spec.from_dict(PRESETS["gpt2"].to_dict()) == PRESETS["gpt2"]
    expected = {"gpt-tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-175b", "megatron-1.7b",
                "megatron-3.6b", "megatron-7.5b", "megatron-18b", "megatron-39b", "megatron-76b", "megatron-145b",
                "megatron-310b", "megatron-530b", "megatron-1t"}
    assert set(spec.presets) == expected
    for name, c in spec.presets.items():
        assert c.name == name and c.family == "gpt" and c.dtype == "bf16" and c.seq_len > 0


def test_the_family_reads_gpt2_keys():
    host = fresh_host((plugin, "gpt"))
    assert host.config_from_hf(to_hf(PRESETS["gpt2-xl"])) == PRESETS["gpt2-xl"]
    with pytest.raises(UsageError, match="nearest, gpt, needs n_embd"):
        host.config_from_hf({"model_type": "llama", "hidden_size": 4096})


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in entry_points(group="stage")}
    assert names.get("gpt") == "stage_model_gpt.plugin"


def test_tiny_default():
    c = PRESETS["gpt-tiny"]
    assert (c.layers, c.hidden, c.heads, c.padded_vocab, c.max_positions, c.seq_len) == (2, 128, 4, 512, 256, 256)
    assert GPTConfig() == c.replace(name="gpt")


@pytest.mark.parametrize(
    "change,field",
    [
        ({"heads": 5}, "heads"),  # 5 does not divide 128
        ({"layers": 0}, "layers"),
        ({"hidden": -128}, "hidden"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"vocab_pad_to": 0}, "vocab_pad_to"),
        ({"ffn_hidden": 0}, "ffn_hidden"),
        ({"seq_len": 512}, "seq_len"),  # more than max_positions 256
        ({"layers": 2.0}, "layers"),
        ({"layers": True}, "layers"),
        ({"attention": "sparse"}, "attention"),
        ({"dtype": "int8"}, "dtype"),
        ({"family": "llama"}, "family"),
        ({"tie_embeddings": "no"}, "tie_embeddings"),
    ],
)
def test_invalid_configs_name_the_field(change, field):
    with pytest.raises(UsageError, match=field):
        PRESETS["gpt-tiny"].replace(**change)


def test_overrides_and_dict_round_trip():
    c = PRESETS["gpt-tiny"].with_overrides({"layers": "3", "attention": "classic", "tie_embeddings": "false"})
    assert (c.layers, c.attention, c.tie_embeddings) == (3, "classic", False)
    assert GPTConfig.from_dict(c.to_dict()) == c
    with pytest.raises(UsageError, match="heads"):
        PRESETS["gpt-tiny"].with_overrides({"heads": "3"})


def test_dims_and_meta():
    c = PRESETS["gpt3-175b"]
    g = build(c)
    assert g.dims == {"h": 12288, "a": 96, "g": 96, "d": 128, "f": 49152, "V": 51200, "P": 2048}
    assert not set(PLAN_DIMS) & set(g.dims)
    assert g.meta["layers"] == 96 and g.meta["seq_len"] == 2048
    used = set()
    for op in g.ops:
        for t in op.inputs + op.outputs:
            for size in t.shape:
                used |= sym.names_in(size)
    assert used == set(g.dims) | set(PLAN_DIMS)


def test_layer_layout_and_names():
    c = PRESETS["gpt-tiny"].replace(attention="classic")
    g = build(c)
    names = {op.name for op in g.ops}
    for i in range(c.layers):
        for part in ("attn.norm", "attn.qkv", "attn.split", "attn.scores", "attn.softmax", "attn.dropout",
                     "attn.context", "attn.proj", "attn.residual", "mlp.norm", "mlp.fc1", "mlp.bias_gelu",
                     "mlp.fc2", "mlp.residual"):
            assert f"layers.{i}.{part}" in names
    outside = [op for op in g.ops if op.layer is None]
    assert [op.name for op in outside] == ["embed", "embed.dropout", "final_norm", "head", "loss"]
    by_name = {op.name: op for op in g.ops}
    assert all(op.layer == int(op.name.split(".")[1]) for op in g.ops if op.layer is not None)
    core = {op.name for op in g.ops if op.block == "attn_core"}
    assert core == {f"layers.{i}.attn.{p}" for i in range(c.layers)
                    for p in ("scores", "softmax", "dropout", "context")}
    assert by_name["layers.0.attn.qkv"].attrs["einsum"] == "bsh,hgcd->bsgcd"
    assert by_name["layers.0.attn.qkv"].attrs["has_bias"]
    assert by_name["layers.0.attn.proj"].attrs["einsum"] == "bsgrd,grdh->bsh"
    assert by_name["layers.0.attn.residual"].fn == "bias_dropout_add"
    assert by_name["layers.0.mlp.fc1"].attrs["einsum"] == "bsh,hf->bsf"
    assert not by_name["layers.0.mlp.fc1"].attrs["has_bias"]
    assert by_name["layers.0.mlp.bias_gelu"].fn == "bias_gelu"
    assert by_name["head"].attrs["einsum"] == "bsh,vh->bsv"


def test_attention_shapes():
    g = build(PRESETS["gpt2"])
    split = next(op for op in g.ops if op.name == "layers.0.attn.split")
    q, k, v = split.outputs
    b, s, kv, a, d = sym.dims("b s g a d")
    assert q.shape == (b, s, kv, a / kv, d)
    assert k.shape == v.shape == (b, s, kv, d)
    w_qkv = next(p for p in g.params if p.name == "layers.0.attn.qkv.weight")
    assert w_qkv.shape == (sym.dim("h"), kv, a / kv + 2, d)
    flash = next(op for op in g.ops if op.name == "layers.0.attn.flash")
    assert flash.block == "attn_core" and flash.fn == "flash_attention"


def test_residual_stream_is_tagged():
    c = PRESETS["gpt-tiny"]
    g = build(c)
    tagged = [op.name for op in g.ops if any("residual" in t.tags for t in op.outputs)]
    expected = ["embed.dropout"] + [f"layers.{i}.{p}.residual" for i in range(c.layers) for p in ("attn", "mlp")]
    assert tagged == expected


def test_tied_and_untied_head():
    tied = build(PRESETS["gpt-tiny"])
    head = next(op for op in tied.ops if op.name == "head")
    assert head.inputs[1].name == "embed.wte"
    untied = build(PRESETS["gpt-tiny"].replace(tie_embeddings=False))
    head = next(op for op in untied.ops if op.name == "head")
    assert head.inputs[1].name == "head.weight"


def test_largest_preset_builds_whole():
    # its build time is a benchmark figure (benchmarks/bench_generate.py), not a timed test
    g = build(PRESETS["megatron-1t"])
    assert g.meta["layers"] == 128
