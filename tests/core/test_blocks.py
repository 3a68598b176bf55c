"""The standard blocks (stage_core.ir.blocks) and the model helpers (stage_core.models) by hand."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from stage_core import sym
from stage_core.autodiff import differentiate
from stage_core.errors import UsageError
from stage_core.ir import GraphBuilder, blocks, kernels
from stage_core.models import (HFKeys, ModelConfig, check_at_most, check_bool, check_choice, check_divides,
                               check_int, check_positive_number, check_str, evaluate_sum, load_hf_config, padded,
                               saved_bytes_per_layer, step_values, total, training_flops)

# b=2, s=3, h=8, a=4 query heads in g=2 groups (2 per group), d=2, f=12
DIMS = {"b": 2, "s": 3, "h": 8, "a": 4, "g": 2, "d": 2, "f": 12, "V": 16}


def attention_graph(**options):
    g = GraphBuilder("attn", dims=DIMS)
    x = g.input("x", ("b", "s", "h"), dtype="bf16")
    with g.layer(0):
        out = blocks.gqa_attention(g, x, **options)
    return g.finish(g.reduce_sum(out, "bsh->b", name="loss"))


def forward(graph, what: str, block: str | None = None) -> int:
    ops = [op for op in graph.ops if block is None or op.block == block]
    return total(graph, what, DIMS, ops)


# ---------------------------------------------------------------------- attention
def test_gqa_layout_names_and_shapes():
    graph = attention_graph(qkv_bias=True, qk_norm="rmsnorm", rope=True)
    params = {p.name: tuple(sym.evaluate(e, DIMS) for e in p.shape) for p in graph.params}
    assert params == {
        "layers.0.attn.qkv.weight": (8, 2, 4, 2),  # [h, g, a/g+2, d]
        "layers.0.attn.qkv.bias": (2, 4, 2),
        "layers.0.attn.q_norm.weight": (2,),
        "layers.0.attn.k_norm.weight": (2,),
        "layers.0.attn.proj.weight": (2, 2, 2, 8),  # [g, a/g, d, h]
    }
    names = [op.name.removeprefix("layers.0.attn.") for op in graph.ops]
    assert names == ["qkv", "split", "q_norm", "k_norm", "q_rope", "k_rope", "flash", "proj", "loss"]
    assert [op.name for op in graph.ops if op.block == "attn_core"] == ["layers.0.attn.flash"]
    assert all(op.layer == 0 for op in graph.ops[:-1])


def test_classic_attention_flops_by_hand():
    b, s, h, a, g, d = 2, 3, 8, 4, 2, 2
    graph = attention_graph(kind="classic", qkv_bias=True)
    ops = {op.name.removeprefix("layers.0.attn."): op for op in graph.ops}
    assert [op.name.split(".")[-1] for op in graph.ops if op.block == "attn_core"] == ["scores", "softmax",
                                                                                       "context"]
    ev = lambda e: sym.evaluate(e, DIMS)  # noqa: E731
    # QKV: [b·s, h] x [h, (a + 2g)·d] = 6·8·16 multiply-adds; its bias one add per output
    assert ev(ops["qkv"].matmul_flops) == 2 * b * s * h * (a + 2 * g) * d == 1536
    assert ev(ops["qkv"].other_flops) == b * s * (a + 2 * g) * d == 96
    # scores and context: per head an [s, d] x [d, s] and an [s, s] x [s, d] product
    assert ev(ops["scores"].flops) == ev(ops["context"].flops) == 2 * b * a * s * s * d == 288
    assert ev(ops["softmax"].flops) == kernels.SOFTMAX[0] * b * a * s * s == 504
    assert ev(ops["proj"].flops) == 2 * b * s * a * d * h == 768
    assert forward(graph, "matmul_flops") == 1536 + 288 + 288 + 768
    # the probabilities (bf16) are kept for backward
    assert ev(ops["softmax"].outputs[0].nbytes) == 2 * b * a * s * s


def test_flash_equals_classic_in_flops_and_halves_causally():
    classic, flash = attention_graph(kind="classic"), attention_graph(kind="flash")
    for what in ("matmul_flops", "other_flops"):
        assert forward(classic, what, "attn_core") == forward(flash, what, "attn_core")
    assert forward(flash, "matmul_flops", "attn_core") == 2 * 288
    causal = attention_graph(kind="flash", causal_flops=True)
    assert 2 * forward(causal, "flops", "attn_core") == forward(flash, "flops", "attn_core")
    causal_classic = attention_graph(kind="classic", causal_flops=True)
    assert forward(causal_classic, "matmul_flops", "attn_core") == 288
    # flash keeps no s×s tensor: only the fp32 log-sum-exp per query row
    (fl,) = [op for op in flash.ops if op.block == "attn_core"]
    assert sym.evaluate(fl.outputs[1].nbytes, DIMS) == 4 * 2 * 4 * 3


def test_classic_attention_dropout_keeps_a_mask():
    graph = attention_graph(kind="classic", dropout=True)
    core = [op for op in graph.ops if op.block == "attn_core"]
    assert [op.name.split(".")[-1] for op in core] == ["scores", "softmax", "dropout", "context"]
    assert core[2].outputs[1].dtype == "u8"
    # flash attention's dropout costs nothing here
    assert [op.fn for op in attention_graph(dropout=True).ops if op.block == "attn_core"] == ["flash_attention"]


def test_attention_core_gives_a_narrower_value_its_own_letter():
    g = GraphBuilder("mla", dims={"b": 1, "s": 4, "g": 2, "dk": 6, "dv": 4})
    q = g.input("q", ("b", "s", "g", 1, "dk"), dtype="bf16")
    k = g.input("k", ("b", "s", "g", "dk"), dtype="bf16")
    v = g.input("v", ("b", "s", "g", "dv"), dtype="bf16")
    out = blocks.attention_core(g, q, k, v, kind="classic")
    assert g.graph.ops[-1].spec == "bgrsk,bkgv->bsgrv"
    assert [str(e) for e in out.shape] == ["b", "s", "g", "1", "dv"]
    with pytest.raises(ValueError, match="ring"):
        blocks.attention_core(g, q, k, v, kind="ring")


# ---------------------------------------------------------------------- MLPs, embedding, head
def mlp_graph(block):
    g = GraphBuilder("mlp", dims=DIMS)
    x = g.input("x", ("b", "s", "h"), dtype="bf16")
    out = block(g, x)
    return g.finish(g.reduce_sum(out, "bsh->b", name="loss"))


def test_swiglu_mlp_by_hand():
    graph = mlp_graph(blocks.swiglu_mlp)
    assert [op.name for op in graph.ops] == ["mlp.gate", "mlp.up", "mlp.swiglu", "mlp.down", "loss"]
    assert [p.name for p in graph.params] == ["mlp.gate.weight", "mlp.up.weight", "mlp.down.weight"]
    # three [b·s, h] x [h, f] products
    assert forward(graph, "matmul_flops") == 3 * 2 * 2 * 3 * 8 * 12
    assert forward(graph, "other_flops", None) == (kernels.ELEMENTWISE["swiglu"][0] * 2 * 3 * 12
                                                   + kernels.REDUCTION_SUM * 2 * 3 * 8)
    other = mlp_graph(lambda g, x: blocks.swiglu_mlp(g, x, sym.dim("h"), prefix="moe.shared"))
    assert [p.name for p in other.params][0] == "moe.shared.gate.weight"
    assert forward(other, "matmul_flops") == 3 * 2 * 2 * 3 * 8 * 8


def test_gelu_mlp_by_hand():
    graph = mlp_graph(blocks.gelu_mlp)
    assert [op.name for op in graph.ops] == ["mlp.fc1", "mlp.bias_gelu", "mlp.fc2", "loss"]
    assert [p.name for p in graph.params] == ["mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight"]
    assert forward(graph, "matmul_flops") == 2 * 2 * 2 * 3 * 8 * 12


def test_embed_norm_and_head_make_a_whole_model():
    g = GraphBuilder("lm", dims={**DIMS, "P": 5})
    x, labels, wte = blocks.embed(g, positions=True)
    assert "residual" in x.tags
    y = blocks.norm(g, x, "ln", "layernorm", bias=True)
    graph = blocks.lm_head(g, y, labels, wte, tied=True)
    assert [p.name for p in graph.params] == ["embed.wte", "embed.wpe", "ln.weight", "ln.bias",
                                              "final_norm.weight"]
    assert [op.name for op in graph.ops] == ["embed", "ln", "final_norm", "head", "loss"]
    assert forward(graph, "matmul_flops") == 2 * 2 * 3 * 8 * 16
    untied = GraphBuilder("lm", dims=DIMS)
    x, labels, wte = blocks.embed(untied)
    assert [p.name for p in blocks.lm_head(untied, x, labels, wte).params][-1] == "head.weight"


# ---------------------------------------------------------------------- config checks
@dataclasses.dataclass(frozen=True)
class Cfg(ModelConfig):
    name: str = "c"
    family: str = "test"
    hidden: int = 128
    heads: int = 4
    kv_heads: int | None = None
    layers: int = 2
    seq_len: int = 64
    max_positions: int = 128
    scale: float = 1.0
    bias: bool = False
    attention: str = "flash"

    def __post_init__(self):
        check_str(self, "name")
        check_int(self, "hidden", "heads", "layers", "seq_len", "max_positions")
        check_int(self, "kv_heads", optional=True)
        check_bool(self, "bias")
        check_positive_number(self, "scale")
        check_choice(self, "attention", blocks.ATTENTION_KINDS)
        check_divides(self, "heads", "hidden", "the head dim is hidden/heads")
        check_divides(self, "kv_heads", "heads")
        check_at_most(self, "seq_len", "max_positions")


@pytest.mark.parametrize("change,message", [
    ({"name": 3}, "Cfg name=3: expected a string"),
    ({"hidden": 0}, "Cfg hidden=0: expected a positive integer"),
    ({"layers": True}, "Cfg layers=True: expected a positive integer"),
    ({"kv_heads": 1.5}, "Cfg kv_heads=1.5: expected a positive integer"),
    ({"bias": 1}, "Cfg bias=1: expected true or false"),
    ({"scale": -1.0}, "Cfg scale=-1.0: expected a positive number"),
    ({"attention": "ring"}, "Cfg attention='ring': valid values are flash, classic"),
    ({"heads": 3}, "Cfg heads=3 does not divide hidden=128: the head dim is hidden/heads"),
    ({"kv_heads": 3}, "Cfg kv_heads=3 does not divide heads=4"),
    ({"seq_len": 256}, "Cfg seq_len=256 exceeds max_positions=128"),
])
def test_config_checks_name_the_field(change, message):
    with pytest.raises(UsageError) as info:
        Cfg(**change)
    assert str(info.value) == message


def test_check_int_minimum_and_why():
    @dataclasses.dataclass(frozen=True)
    class Ranks(ModelConfig):
        rank: int = 0

        def __post_init__(self):
            check_int(self, "rank", minimum=0, why="a rank")

    assert Ranks(rank=0).rank == 0
    with pytest.raises(UsageError, match=r"Ranks rank=-1: expected an integer >= 0 \(a rank\)"):
        Ranks(rank=-1)


def test_padded():
    assert padded(50257, 128) == 50304
    assert padded(512, 128) == 512
    assert padded(1, 1) == 1


# ---------------------------------------------------------------------- config.json
def test_load_hf_config_from_a_dict_a_file_or_a_folder(tmp_path):
    data = {"model_type": "x", "hidden_size": 8}
    assert load_hf_config(data) == (data, "config.json")
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert load_hf_config(tmp_path) == (data, str(tmp_path / "config.json"))
    assert load_hf_config(str(tmp_path / "config.json"))[0] == data


@pytest.mark.parametrize("text,message", [(None, "cannot read"), ("{", "not valid JSON"), ("[1]", "JSON object"),
                                          ("[" * 50_000 + "]" * 50_000, "nested too deep"),
                                          ('{"a": ' + "9" * 5_000 + "}", "too long|digits"),
                                          ("fifo", "not a regular file but a FIFO")])
def test_load_hf_config_errors(tmp_path, text, message):
    """Every unreadable config.json is one line (a FIFO is refused without blocking on it)."""
    path = tmp_path / "config.json"
    if text == "fifo":
        os.mkfifo(path)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_hf_config(path)


def test_hf_keys_name_the_key():
    r = HFKeys({"model_type": "m", "a": 4, "zero": 0, "flag": "yes", "x": -1.0, "n_ctx": 7, "layers": [1, -2]})
    assert (r.model_type, r.model_name) == ("m", "hf-m")
    assert r.int("a") == 4
    assert r.int("missing", default=None) is None and r.int("zero", 5, minimum=0) == 0
    assert r.int("n_positions", or_keys=("n_ctx",)) == 7
    with pytest.raises(UsageError) as info:
        r.int("hidden_size")
    assert str(info.value) == "config.json: required key 'hidden_size' is missing (model_type 'm')"
    with pytest.raises(UsageError, match=r"config.json: key 'zero'=0: expected a positive integer"):
        r.int("zero")
    with pytest.raises(UsageError, match="'flag'='yes': expected true or false"):
        r.bool("flag", False)
    with pytest.raises(UsageError, match="'x'=-1.0: expected a positive number"):
        r.number("x", 1.0)
    with pytest.raises(UsageError, match="'layers'"):
        r.index_list("layers")
    with pytest.raises(UsageError, match="'a'=4: does not divide 6"):
        r.fail("a", "does not divide 6")
    assert r.bool("absent", True) is True and r.number("absent", 2.5) == 2.5 and r.index_list("absent") == ()


def test_hf_keys_stage_section_and_make():
    r = HFKeys({"stage": {"seq_len": 32, "bogus": 1}}, label="dir/config.json")
    with pytest.raises(UsageError, match=r"dir/config.json: unknown key\(s\) stage.bogus; valid: seq_len"):
        r.stage_section(("seq_len",))
    assert HFKeys({"stage": {"seq_len": 32}}).stage_section(("seq_len",)) == {"seq_len": 32}
    with pytest.raises(UsageError, match="'stage' must be an object"):
        HFKeys({"stage": []}).stage_section(("seq_len",))
    with pytest.raises(UsageError, match=r"^dir/config.json: unknown key\(s\) stage.bogus; valid: name, seq_len"):
        r.make(Cfg, {"heads": 2})  # make reads the "stage" object for every family
    r = HFKeys({"stage": {"seq_len": 32}}, label="dir/config.json")
    with pytest.raises(UsageError, match="^dir/config.json: Cfg heads=3 does not divide"):
        r.make(Cfg, {"heads": 3})
    made = r.make(Cfg, {"heads": 2, "seq_len": 8})
    assert made.heads == 2 and made.seq_len == 32  # the "stage" object wins over what config.json implied
    assert made.stage_block() == {"name": made.name, "seq_len": 32, "attention": made.attention}


# ---------------------------------------------------------------------- exact totals
def test_totals_of_a_small_model():
    @dataclasses.dataclass(frozen=True)
    class Tiny(ModelConfig):
        name: str = "tiny"
        family: str = "tiny"
        layers: int = 1
        seq_len: int = 3
        dtype: str = "bf16"

        def dims(self):
            return {k: v for k, v in DIMS.items() if k not in ("b", "s")}

    g = blocks.model_builder(Tiny(), attention="classic")
    assert (g.graph.name, g.graph.meta) == ("tiny", {"family": "tiny", "layers": 1, "seq_len": 3,
                                                     "attention": "classic"})
    x, labels, wte = blocks.embed(g)
    with g.layer(0):
        x = g.add(blocks.gqa_attention(g, blocks.norm(g, x, "attn.norm"), kind="classic"), x, name="res")
    graph = blocks.lm_head(g, x, labels, wte)
    values = step_values(graph, b=2)
    assert values == DIMS
    assert evaluate_sum([sym.dim("h"), sym.dim("h"), sym.dim("d")], values) == 18
    fwd = total(graph, "matmul_flops", values)
    assert fwd == 1536 + 2 * 288 + 768 + 2 * 2 * 3 * 8 * 16
    # every einsum needs both input gradients: backward matmuls are twice the forward's
    assert training_flops(graph, b=2) == 3 * fwd
    assert training_flops(graph, b=2, what="flops") == total(differentiate(graph), "flops", values)
    (per_layer,) = saved_bytes_per_layer(differentiate(graph), values).values()
    assert per_layer > 2 * 2 * 4 * 3 * 3  # at least the bf16 probabilities
