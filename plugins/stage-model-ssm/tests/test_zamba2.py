"""Zamba2: Mamba-2 layers and shared transformer blocks, against transformers' modeling_zamba2.

Parameters are counted by hand from the tensors transformers' Zamba2 modules create
(``Zamba2MambaMixer``, ``Zamba2AttentionDecoderLayer``, ``Zamba2MLP``, the hybrid
layers' ``linear``): the shared blocks once, their adapters and linears once per use.
FLOPs are counted by hand per use of a block: the block's matmuls run at every hybrid
layer.  The published counts are checked against the checkpoints' bf16 files as the Hub
lists them (2 bytes a parameter; the listing rounds to three digits).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stage_core.api import UsageError, evaluate_sum, hf_import_of, inference_graph, layer_kinds, param_counts, \
    step_values, total
from stage_core.testing import fresh_host

from public_ssm_configs import ZAMBA2_2_7B
from stage_model_ssm import PRESETS, build, plugin, to_hf

CONFIGS = Path(__file__).parent / "configs"


def mamba_layer_params(c) -> int:
    """Zamba2MambaDecoderLayer: in_proj h·(2·d_in + 2·G·N + H), conv1d (d_in + 2·G·N)·(k + 1)
    with its bias, dt_bias, A_log and D (H each), the gated norm d_in, out_proj d_in·h, the
    layer's input RMSNorm h."""
    h, d_in, G, N, H, k = c.hidden, c.ssm_inner, c.ssm_groups, c.ssm_state, c.ssm_heads, c.conv_kernel
    return h * (2 * d_in + 2 * G * N + H) + (d_in + 2 * G * N) * (k + 1) + 3 * H + d_in + d_in * h + h


def shared_block_params(c) -> int:
    """Zamba2AttentionDecoderLayer without adapters: input_layernorm 2h, q/k/v_proj from 2h to
    heads·d (KV heads·d), o_proj heads·d·h, pre_ff_layernorm h, gate_up_proj h·2f, down_proj f·h."""
    h, a, g, d, f = c.hidden, c.heads, c.groups, c.head_size, c.ffn_hidden
    return 2 * h + 2 * h * (a + 2 * g) * d + a * d * h + h + h * 2 * f + f * h


def per_use_params(c) -> int:
    """What each hybrid layer holds of its own: the MLP adapter (h·r + r·2f), the q, k, v
    adapters (3 of 2h·r + r·2h) when the config has them, and the linear h·h."""
    h, f, r = c.hidden, c.ffn_hidden, c.adapter_rank
    return (h * r + r * 2 * f) * c.shared_mlp_adapter + 3 * (2 * h * r + r * 2 * h) * c.shared_attn_adapter + h * h


def zamba2_params(c) -> int:
    return (len(c.pattern) * mamba_layer_params(c) + c.shared_blocks * shared_block_params(c)
            + c.shared_uses * per_use_params(c) + c.padded_vocab * c.hidden * (1 if c.tie_embeddings else 2)
            + c.hidden)


#: by hand (zamba2_params) from the published configs; the Hub's bf16 files: Zyphra/Zamba2-1.2B's
#: model.safetensors 2.43 GB, Zamba2-2.7B-instruct's 4.94 GB + 384 MB, Zamba2-7B-Instruct's
#: 4.81 + 4.97 + 4.93 GB (their transformers-format checkpoints); the tech report (Glorioso et
#: al. 2024, arXiv 2411.15242): 1.2B, 2.7B and 7.4B
PUBLISHED = {
    "zamba2-1.2b": (1_215_064_704, (2.43,)),
    "zamba2-2.7b": (2_662_214_560, (4.94, 0.384)),
    "zamba2-7b": (7_356_749_648, (4.81, 4.97, 4.93)),
}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_published_counts_by_hand_and_the_checkpoints_files(model):
    c = PRESETS[model]
    count, files = PUBLISHED[model]
    assert zamba2_params(c) == count
    assert param_counts(build(c)) == (count, count)
    # 2 bytes a parameter, within the listing's rounding (half a unit of its last digit a file)
    slack = sum(0.0005 if size < 1 else 0.005 for size in files)
    assert abs(2 * count / 1e9 - sum(files)) <= slack


def test_shared_weights_are_counted_once_and_their_flops_at_every_use():
    c = PRESETS["zamba2-tiny"]  # MMHMHMH: blocks 0, 1, 0 at layers 2, 4, 6
    g = build(c)
    h, V, a, d, f, r = c.hidden, c.padded_vocab, c.heads, c.head_size, c.ffn_hidden, c.adapter_rank
    # by hand: 7 Mamba layers of 109,528, two blocks of 328,064, three uses of 33,792, the tied
    # table 512·128 and the final norm
    assert (mamba_layer_params(c), shared_block_params(c), per_use_params(c)) == (109_528, 328_064, 33_792)
    assert param_counts(g)[0] == zamba2_params(c) == 7 * 109_528 + 2 * 328_064 + 3 * 33_792 + 512 * 128 + 128
    shared = [p for p in g.params if p.name.startswith("shared.")]
    assert sorted({p.name.split(".")[1] for p in shared}) == ["0", "1"] and len(shared) == 2 * 6
    # one use's matmuls per token at s tokens: qkv 2·2h·3·a·d, the q/k/v adapters
    # 2·2h·3r + 3·2·r·a·d, flash attention 2·2·s·a·d (Q·Kᵀ and P·V over s keys), proj 2·a·d·h,
    # gate_up 2·h·2f, the MLP adapter 2·(h·r + r·2f), down 2·f·h, linear 2·h²
    s = 256
    use = (2 * 2 * h * 3 * a * d + 2 * 2 * h * 3 * r + 3 * 2 * r * a * d + 2 * 2 * s * a * d + 2 * a * d * h
           + 2 * h * 2 * f + 2 * (h * r + r * 2 * f) + 2 * f * h + 2 * h * h)
    values = step_values(g, 1, s)
    for layer in c.layer_indices("hybrid"):
        ops = [op for op in g.ops if op.layer == layer and ".shared." in op.name]
        assert total(g, "matmul_flops", values, ops) == s * use
    # one more hybrid layer: the parameters grow by a Mamba layer and one use's own, the
    # FLOPs by a Mamba layer and a whole block
    more = build(c.replace(pattern=c.pattern + "H"))
    assert param_counts(more)[0] - param_counts(g)[0] == mamba_layer_params(c) + per_use_params(c)
    mamba = [op for op in g.ops if op.layer == 0]
    grown = total(more, "matmul_flops", values, more.kernels()) - total(g, "matmul_flops", values, g.kernels())
    assert grown == total(g, "matmul_flops", values, mamba) + s * use
    assert layer_kinds(g) == {"mamba": 4, "shared block + mamba": 3}


def test_decode_keeps_every_mixers_state_and_each_uses_kv_cache():
    c = PRESETS["zamba2-tiny"]
    ig = inference_graph(build(c), "decode")
    H, P, N, G, k = c.ssm_heads, c.ssm_head_dim, c.ssm_state, c.ssm_groups, c.conv_kernel
    one = step_values(ig, b=1, s=1)
    states = [t for t in ig.caches if t.seq_dim is None]
    # every layer holds a mixer: the SSM state H·P·N and the conv state (k−1)·(H·P + 2·G·N)
    assert evaluate_sum([t.tensor.numel for t in states], one) == 7 * (H * P * N + (k - 1) * (H * P + 2 * G * N))
    growing = [t for t in ig.caches if t.seq_dim is not None]
    # each of the 3 uses keeps its own keys and values: 2·g·d a token each
    assert len(growing) == 2 * 3
    assert evaluate_sum([t.tensor.numel for t in growing], {**one, "ctx": 1}) == 3 * 2 * c.groups * c.head_size


def test_zamba2_7b_inference_cache_per_request():
    c = PRESETS["zamba2-7b"]
    host = fresh_host((plugin, "ssm"))
    from stage_core.api import Plan, plan_job

    inference = plan_job(host, "zamba2-7b", {}, Plan(task="decode", context_len=4096), programs=False).manifest[
        "inference"]
    # 81 Mamba-2 mixers: 2 bytes · (112·64·64 + 3·(7168 + 2·2·64)); 13 uses of 32 KV heads of 224
    assert inference["recurrent_state_bytes_per_request"] == 81 * 2 * (112 * 64 * 64 + 3 * (7168 + 256)) \
        == 77_925_888
    assert inference["kv_cache_bytes_per_request"] == 77_925_888 + 13 * 2 * 32 * 224 * 2 * 4096
    assert c.shared_uses == 13


def published(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_zyphras_original_config_json_imports_as_the_preset():
    host = fresh_host((plugin, "ssm"))
    c = host.config_from_hf(published("Zamba2-1.2B"))
    assert c.family == "zamba2" and c.replace(name="zamba2-1.2b") == PRESETS["zamba2-1.2b"]
    assert param_counts(build(c))[0] == PUBLISHED["zamba2-1.2b"][0]
    assert (c.shared_attn_adapter, c.shared_mlp_adapter, c.rope, c.head_size) == (True, True, True, 128)
    ignored = hf_import_of(c)["ignored_keys"]
    assert "rope_theta" in ignored and not {"kv_channels", "lora_rank", "layers_block_type"} & set(ignored)


def test_transformers_keys_import_as_the_preset():
    c = fresh_host((plugin, "ssm")).config_from_hf(ZAMBA2_2_7B)
    assert c.replace(name="zamba2-2.7b") == PRESETS["zamba2-2.7b"]
    assert c.layer_indices("hybrid") == (6, 12, 18, 24, 30, 36, 42, 47, 51)


@pytest.mark.parametrize("name", ["zamba2-tiny", "zamba2-1.2b", "zamba2-2.7b", "zamba2-7b"])
def test_round_trip(name):
    c = PRESETS[name]
    assert fresh_host((plugin, "ssm")).config_from_hf(to_hf(c)) == c


def test_set_num_hidden_layers_cuts_the_layer_list():
    host = fresh_host((plugin, "ssm"))
    c = host.config_from_hf(published("Zamba2-1.2B")).with_overrides({"num_hidden_layers": "12"})
    assert c.pattern == "MMMMMH" * 2 and c.shared_uses == 2


@pytest.mark.parametrize("change,key", [
    ({"attention_head_dim": 64}, "attention_head_dim"),
    ({"layers_block_type": ["m", "x"]}, "layers_block_type"),
    ({"hybrid_layer_ids": [4]}, "hybrid_layer_ids"),
    ({"mamba_headdim": 48}, "mamba_headdim"),
    ({"gated_linear_unit": False}, "gated_linear_unit"),
    ({"num_key_value_heads": 8}, "num_key_value_heads"),
])
def test_a_config_it_cannot_model_is_one_line_naming_the_key(change, key):
    with pytest.raises(UsageError) as err:
        fresh_host((plugin, "ssm")).config_from_hf({**published("Zamba2-1.2B"), **change})
    assert f"'{key}'" in str(err.value) and "\n" not in str(err.value)
