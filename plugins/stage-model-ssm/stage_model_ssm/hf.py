"""Hugging Face ``config.json`` (model_type mamba2, nemotron_h) to and from :class:`HybridConfig`.

mamba2 (transformers' Mamba2Config): ``hidden_size``, ``num_hidden_layers``, ``vocab_size``,
``num_heads``, ``head_dim``, ``state_size``, ``n_groups``, ``conv_kernel``, ``chunk_size``,
``expand`` (num_heads · head_dim must equal expand · hidden_size), ``tie_word_embeddings``
(default true), ``rms_norm`` (true only), ``use_bias`` (false only), ``use_conv_bias`` (true
only), ``hidden_act`` (silu).  Every layer is a Mamba-2 layer.

nemotron_h: ``hybrid_override_pattern`` (or ``layers_block_type``, a list of mamba,
attention, mlp, moe) with ``num_hidden_layers`` its length, ``hidden_size``,
``vocab_size``, ``mamba_num_heads``, ``mamba_head_dim``, ``n_groups``, ``ssm_state_size``,
``conv_kernel``, ``chunk_size``, ``num_attention_heads``, ``num_key_value_heads``,
``attention_head_dim`` (or ``head_dim``), ``intermediate_size``, ``mlp_hidden_act`` (relu2),
``max_position_embeddings``, ``tie_word_embeddings`` (default false); the biases
(``use_bias``, ``mamba_proj_bias``, ``attention_bias``, ``mlp_bias``) false only,
``use_conv_bias`` true only; MoE layers: ``n_routed_experts``, ``num_experts_per_tok``,
``moe_intermediate_size``, ``moe_shared_expert_intermediate_size`` (sigmoid router).
Attention has no rotary embedding (Nemotron-H's attention layers take no positions).

zamba2 (transformers' Zamba2Config, and the keys of Zyphra's original config.json files,
read where transformers' are absent): ``layers_block_type`` (``mamba``/``hybrid``, or
``m``/``g``) cut to ``num_hidden_layers`` (``hybrid_layer_ids``, when present, must agree),
``hidden_size``, ``vocab_size``, ``mamba_d_state`` (``state_size``), ``mamba_d_conv``
(``conv_dimension``), ``mamba_expand`` (``expansion_factor``), ``mamba_ngroups``,
``n_mamba_heads`` and ``mamba_headdim`` (heads · head dim = expand · hidden),
``chunk_size``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``
(``ffn_hidden_size``; default 4·hidden), ``hidden_act`` (gelu: GeGLU, silu: SwiGLU; the
original files' ``gated_linear_unit`` true only), ``num_mem_blocks``,
``use_shared_attention_adapter`` (``use_shared_attention_lora``),
``use_shared_mlp_adapter`` (``use_shared_block_lora``; default true: transformers'
Zamba2MLP builds the MLP adapters whatever the key says, and the published files hold
them), ``adapter_rank`` (``lora_rank``), ``use_mem_rope``, ``max_position_embeddings``
(16384 with ``use_long_context``), ``tie_word_embeddings`` (default true); the derived
``attention_head_dim`` (2·hidden/heads), ``attention_hidden_size`` (2·hidden),
``kv_channels`` and ``num_query_groups`` are checked or read as derived;
``add_bias_linear`` false only, ``use_conv_bias`` true only, ``ft_lora`` false only.

Every error is one line naming the key.  STAGE's own settings travel in the optional
``"stage"`` object.  Without one the training sequence length is
``min(max_position_embeddings, 8192)`` (mamba2, which has no positions limit: 2048).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from stage_core.api import HFKeys, HFReader, UsageError, load_hf_config

from .config import LAYER_KINDS, HybridConfig

MODEL_TYPES = ("mamba2", "nemotron_h", "mamba", "falcon_mamba", "jamba", "zamba2")
ARCHITECTURES = {"mamba2": "Mamba2ForCausalLM", "nemotron_h": "NemotronHForCausalLM",
                 "mamba": "FalconMambaForCausalLM", "jamba": "JambaForCausalLM", "zamba2": "Zamba2ForCausalLM"}
#: Zamba2's layers_block_type entries (transformers' names, and Zyphra's original m/g)
ZAMBA2_BLOCKS = {"mamba": "M", "hybrid": "H", "m": "M", "g": "H"}
DEFAULT_SEQ_CAP = 8192
MAMBA2_SEQ_LEN = 2048
BLOCK_TYPES = {kind: ch for ch, kind in LAYER_KINDS.items()}
#: the config.json key behind each field a config check may name
FIELD_KEYS = {
    "mamba": {"hidden": "hidden_size", "vocab_size": "vocab_size", "ssm_channels": "intermediate_size",
              "ssm_state": "state_size", "conv_kernel": "conv_kernel", "dt_rank": "time_step_rank",
              "pattern": "num_hidden_layers"},
    "jamba": {"hidden": "hidden_size", "vocab_size": "vocab_size", "ssm_state": "mamba_d_state",
              "conv_kernel": "mamba_d_conv", "dt_rank": "mamba_dt_rank", "heads": "num_attention_heads",
              "kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size", "experts": "num_experts",
              "experts_per_token": "num_experts_per_tok", "max_positions": "max_position_embeddings",
              "pattern": "num_hidden_layers"},
    "mamba2": {"hidden": "hidden_size", "vocab_size": "vocab_size", "ssm_heads": "num_heads",
               "ssm_head_dim": "head_dim", "ssm_groups": "n_groups", "ssm_state": "state_size",
               "conv_kernel": "conv_kernel", "chunk_size": "chunk_size", "pattern": "num_hidden_layers"},
    "zamba2": {"hidden": "hidden_size", "vocab_size": "vocab_size", "ssm_heads": "n_mamba_heads",
               "ssm_head_dim": "mamba_headdim", "ssm_groups": "mamba_ngroups", "ssm_state": "mamba_d_state",
               "conv_kernel": "mamba_d_conv", "chunk_size": "chunk_size", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size", "shared_blocks": "num_mem_blocks",
               "adapter_rank": "adapter_rank", "max_positions": "max_position_embeddings",
               "pattern": "layers_block_type"},
    "nemotron_h": {"hidden": "hidden_size", "vocab_size": "vocab_size", "ssm_heads": "mamba_num_heads",
                   "ssm_head_dim": "mamba_head_dim", "ssm_groups": "n_groups", "ssm_state": "ssm_state_size",
                   "conv_kernel": "conv_kernel", "chunk_size": "chunk_size", "heads": "num_attention_heads",
                   "kv_heads": "num_key_value_heads", "head_dim": "attention_head_dim",
                   "ffn_hidden": "intermediate_size", "experts": "n_routed_experts",
                   "experts_per_token": "num_experts_per_tok", "expert_ffn_hidden": "moe_intermediate_size",
                   "max_positions": "max_position_embeddings", "pattern": "hybrid_override_pattern"},
}


def config_from_hf(source: Mapping[str, Any] | str | os.PathLike) -> HybridConfig | None:
    """A :class:`HybridConfig` from a mamba2 or nemotron_h config.json (dict or path); else ``None``
    (the host reads any model_type by its keys; this function reads these model_types)."""
    data, label = load_hf_config(source)
    if data.get("model_type") not in MODEL_TYPES:
        return None
    family = "mamba" if data["model_type"] == "falcon_mamba" else data["model_type"]
    return read(HFKeys(data, label), family)


def read(r: HFKeys, family: str) -> HybridConfig:
    """A :class:`HybridConfig` of ``family`` from a config.json's keys."""
    fields = {"mamba2": _mamba2, "nemotron_h": _nemotron_h, "mamba": _mamba1, "jamba": _jamba,
              "zamba2": _zamba2}[family](r)
    return r.make(HybridConfig, {"name": r.model_name, "family": family, **fields}, keys=FIELD_KEYS[family])


def _mamba1_mixer(r: HFKeys, hidden: int, prefix: str = "") -> dict[str, Any]:
    """A Mamba-1 mixer's keys: ``<prefix>expand`` or ``intermediate_size`` (d_inner),
    ``<prefix>d_state``/``state_size``, ``<prefix>d_conv``/``conv_kernel``,
    ``<prefix>dt_rank``/``time_step_rank`` ("auto": ceil(hidden/16)), the biases."""
    keys = {"expand": "expand", "state": "state_size", "conv": "conv_kernel", "dt": "time_step_rank",
            "proj_bias": "use_bias", "conv_bias": "use_conv_bias"}
    if prefix:  # Jamba's names
        keys = {"expand": "mamba_expand", "state": "mamba_d_state", "conv": "mamba_d_conv", "dt": "mamba_dt_rank",
                "proj_bias": "mamba_proj_bias", "conv_bias": "mamba_conv_bias"}
    channels = None if prefix else r.int("intermediate_size", default=None)
    channels = channels or r.int(keys["expand"], default=2) * hidden
    dt = r.get(keys["dt"], "auto")
    dt_rank = -(-hidden // 16) if dt == "auto" else r.int(keys["dt"])
    _flag(r, keys["conv_bias"], True, True, "the conv has a bias")
    if r.get("mamba_d_head") is not None or r.get("n_mamba_heads") is not None:
        r.fail("mamba_d_head", "Mamba-2 heads in a Mamba-1 model: not modelled")
    return dict(ssm_version=1, ssm_channels=channels, ssm_state=r.int(keys["state"], default=16),
                conv_kernel=r.int(keys["conv"], default=4), dt_rank=dt_rank,
                ssm_proj_bias=r.bool(keys["proj_bias"], False))


def _mamba1(r: HFKeys) -> dict[str, Any]:
    """Mamba-1 (transformers' MambaConfig and FalconMambaConfig): every layer a Mamba-1 layer."""
    hidden = r.int("hidden_size")
    if r.get("hidden_act", "silu") not in ("silu", "swish"):
        r.fail("hidden_act", "the conv's activation is SiLU; valid: silu")
    for key in ("mixer_rms_eps", "residual_in_fp32", "time_step_scale", "time_step_min", "time_step_max",
                "time_step_init_scheme", "time_step_floor", "rescale_prenorm_residual", "use_mambapy",
                "layer_norm_epsilon"):
        r.get(key)  # FalconMamba's weightless norms of B, C and Δ, initializers: nothing to count
    return dict(pattern="M" * r.int("num_hidden_layers"), hidden=hidden, vocab_size=r.int("vocab_size"),
                tie_embeddings=r.bool("tie_word_embeddings", True), seq_len=MAMBA2_SEQ_LEN,
                **_mamba1_mixer(r, hidden))


def _jamba(r: HFKeys) -> dict[str, Any]:
    """Jamba: layer i is attention when i % attn_layer_period == attn_layer_offset, else
    Mamba-1 (with RMSNorms of Δ, B and C); its FFN is MoE when i % expert_layer_period ==
    expert_layer_offset, else a SwiGLU MLP.  Two pattern characters a layer."""
    hidden, layers = r.int("hidden_size"), r.int("num_hidden_layers")
    periods = {}
    for kind in ("attn", "expert"):
        period = r.int(f"{kind}_layer_period")
        offset = r.int(f"{kind}_layer_offset", minimum=0)
        if offset >= period:
            r.fail(f"{kind}_layer_offset", f"must be below {kind}_layer_period={period}")
        periods[kind] = (period, offset)
    pattern = "".join(("*" if i % periods["attn"][0] == periods["attn"][1] else "M")
                      + ("E" if i % periods["expert"][0] == periods["expert"][1] else "-") for i in range(layers))
    if r.get("hidden_act", "silu") not in ("silu", "swish"):
        r.fail("hidden_act", "Jamba's MLPs and experts are SwiGLU; valid: silu")
    heads = r.int("num_attention_heads")
    kv = r.int("num_key_value_heads", default=None) or heads
    if heads % kv:
        r.fail("num_key_value_heads", f"does not divide num_attention_heads={heads}")
    experts, k = r.int("num_experts"), r.int("num_experts_per_tok")
    if k > experts:
        r.fail("num_experts_per_tok", f"exceeds num_experts={experts} (valid values are 1..{experts})")
    if r.int("sliding_window", default=None) is not None:
        r.fail("sliding_window", "Jamba's attention over a window is not modelled; valid: null")
    positions = r.int("max_position_embeddings", default=None)
    return dict(pattern=pattern, blocks_per_layer=2, hidden=hidden, vocab_size=r.int("vocab_size"),
                tie_embeddings=r.bool("tie_word_embeddings", False), heads=heads, kv_heads=kv, rope=False,
                ffn_hidden=r.int("intermediate_size"), mlp_act="swiglu", experts=experts, experts_per_token=k,
                expert_ffn_hidden=r.int("intermediate_size"), router_score="softmax", max_positions=positions,
                seq_len=min(positions or DEFAULT_SEQ_CAP, DEFAULT_SEQ_CAP), ssm_dt_norm=True,
                **_mamba1_mixer(r, hidden, prefix="mamba_"))


def _flag(r: HFKeys, key: str, default: bool, required: bool, what: str) -> None:
    if r.bool(key, default) != required:
        r.fail(key, f"{what}; valid: {str(required).lower()}")


def _groups(r: HFKeys, heads: int, key: str) -> int:
    groups = r.int(key, default=1)
    if heads % groups:
        r.fail(key, f"each group of B and C serves whole heads: it must divide the {heads} heads")
    return groups


def _mamba2(r: HFKeys) -> dict[str, Any]:
    hidden = r.int("hidden_size")
    heads, head_dim = r.int("num_heads"), r.int("head_dim")
    expand = r.int("expand", default=2)
    if heads * head_dim != expand * hidden:
        r.fail("num_heads", f"num_heads · head_dim = {heads * head_dim} must equal expand · hidden_size = "
                            f"{expand * hidden}")
    if r.get("hidden_act", "silu") not in ("silu", "swish"):
        r.fail("hidden_act", "the conv's activation is SiLU; valid: silu")
    _flag(r, "rms_norm", True, True, "the gated norm is an RMSNorm")
    _flag(r, "use_bias", False, False, "projection biases are not modelled")
    _flag(r, "use_conv_bias", True, True, "the conv has a bias")
    return dict(
        pattern="M" * r.int("num_hidden_layers"),
        hidden=hidden,
        vocab_size=r.int("vocab_size"),
        ssm_heads=heads,
        ssm_head_dim=head_dim,
        ssm_groups=_groups(r, heads, "n_groups"),
        ssm_state=r.int("state_size"),
        conv_kernel=r.int("conv_kernel", default=4),
        chunk_size=r.int("chunk_size", default=256),
        tie_embeddings=r.bool("tie_word_embeddings", True),
        seq_len=MAMBA2_SEQ_LEN,
    )


def _pattern(r: HFKeys, layers: int) -> str:
    if r.get("hybrid_override_pattern") is not None:
        pattern = r.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or set(pattern) - set(LAYER_KINDS):
            r.fail("hybrid_override_pattern", f"expected a string of {', '.join(map(repr, LAYER_KINDS))}")
        key = "hybrid_override_pattern"
    else:
        types = r.get("layers_block_type")
        if not isinstance(types, list) or any(t not in BLOCK_TYPES for t in types):
            r.fail("layers_block_type", f"expected a list of {', '.join(BLOCK_TYPES)} (or a hybrid_override_pattern)")
        pattern, key = "".join(BLOCK_TYPES[t] for t in types), "layers_block_type"
    if len(pattern) != layers:
        r.fail(key, f"has {len(pattern)} layers, num_hidden_layers says {layers}")
    return pattern


def _nemotron_h(r: HFKeys) -> dict[str, Any]:
    pattern = _pattern(r, r.int("num_hidden_layers"))
    for key in ("use_bias", "mamba_proj_bias", "attention_bias", "mlp_bias"):
        _flag(r, key, False, False, "biases are not modelled")
    _flag(r, "use_conv_bias", True, True, "the conv has a bias")
    act = r.get("mlp_hidden_act", "relu2")
    if act != "relu2":
        r.fail("mlp_hidden_act", "Nemotron-H's MLPs are squared ReLU; valid: relu2")
    positions = r.int("max_position_embeddings")
    fields: dict[str, Any] = dict(
        pattern=pattern,
        hidden=r.int("hidden_size"),
        vocab_size=r.int("vocab_size"),
        max_positions=positions,
        seq_len=min(positions, DEFAULT_SEQ_CAP),
        tie_embeddings=r.bool("tie_word_embeddings", False),
        mlp_act="relu2",
        rope=False,
    )
    if "M" in pattern:
        heads = r.int("mamba_num_heads")
        fields.update(ssm_heads=heads, ssm_head_dim=r.int("mamba_head_dim"), ssm_groups=_groups(r, heads, "n_groups"),
                      ssm_state=r.int("ssm_state_size"),
                      conv_kernel=r.int("conv_kernel"), chunk_size=r.int("chunk_size"))
    if "*" in pattern:
        heads = r.int("num_attention_heads")
        kv = r.int("num_key_value_heads", default=None) or heads
        if heads % kv:
            r.fail("num_key_value_heads", f"does not divide num_attention_heads={heads} (valid values divide "
                                          f"{heads})")
        head_dim = r.int("attention_head_dim", default=None, or_keys=("head_dim",))
        if head_dim is None and fields["hidden"] % heads:
            r.fail("num_attention_heads", f"does not divide hidden_size={fields['hidden']} and there is no "
                                          f"attention_head_dim")
        fields.update(heads=heads, kv_heads=kv, head_dim=head_dim)
    if "-" in pattern:
        fields["ffn_hidden"] = r.int("intermediate_size")
    if r.get("moe_latent_size") is not None:
        r.fail("moe_latent_size", "MoE layers whose experts run in a latent width are not modelled; valid: null")
    if "E" in pattern:
        experts, k = r.int("n_routed_experts"), r.int("num_experts_per_tok")
        if k > experts:
            r.fail("num_experts_per_tok", f"exceeds n_routed_experts={experts} (valid values are 1..{experts})")
        fields.update(experts=experts, experts_per_token=k, expert_ffn_hidden=r.int("moe_intermediate_size"),
                      shared_expert_ffn_hidden=r.int("moe_shared_expert_intermediate_size", default=0, minimum=0),
                      router_score="sigmoid")
    return fields


def _zamba2(r: HFKeys) -> dict[str, Any]:
    """Zamba2: Mamba-2 layers and hybrid layers, each a use of a shared transformer block."""
    hidden, layers = r.int("hidden_size"), r.int("num_hidden_layers")
    types = r.get("layers_block_type")
    if not isinstance(types, list) or len(types) < layers or any(t not in ZAMBA2_BLOCKS for t in types):
        r.fail("layers_block_type", f"expected a list of {layers} entries (num_hidden_layers), each mamba or hybrid")
    pattern = "".join(ZAMBA2_BLOCKS[t] for t in types[:layers])
    hybrid = tuple(i for i, ch in enumerate(pattern) if ch == "H")
    listed = r.get("hybrid_layer_ids")
    if listed is not None and tuple(i for i in r.index_list("hybrid_layer_ids") if i < layers) != hybrid:
        r.fail("hybrid_layer_ids", f"the hybrid layers of layers_block_type are {list(hybrid)}")
    # the Mamba-2 mixers
    _flag(r, "add_bias_linear", False, False, "projection biases are not modelled")
    _flag(r, "use_conv_bias", True, True, "the conv has a bias")
    _flag(r, "ft_lora", False, False, "the fine-tuning LoRA of Zyphra's original code is not modelled")
    inner = r.int("mamba_expand", default=2, or_keys=("expansion_factor",)) * hidden
    heads = r.int("n_mamba_heads", default=None)
    head_dim = r.int("mamba_headdim", default=None)
    if heads is None:  # Zyphra's original files give the head dim, transformers' the heads (default 8)
        heads = inner // head_dim if head_dim is not None else 8
    if inner % heads or (head_dim is not None and head_dim != inner // heads):
        r.fail("mamba_headdim" if head_dim is not None else "n_mamba_heads",
               f"n_mamba_heads · mamba_headdim must be mamba_expand · hidden_size = {inner}")
    fields: dict[str, Any] = dict(
        pattern=pattern, hidden=hidden, vocab_size=r.int("vocab_size"),
        ssm_heads=heads, ssm_head_dim=inner // heads, ssm_groups=_groups(r, heads, "mamba_ngroups"),
        ssm_state=r.int("mamba_d_state", default=64, or_keys=("state_size",)),
        conv_kernel=r.int("mamba_d_conv", default=4, or_keys=("conv_dimension",)),
        chunk_size=r.int("chunk_size", default=256), tie_embeddings=r.bool("tie_word_embeddings", True),
    )
    # the shared transformer blocks: attention over [hidden states, embeddings], 2·hidden wide
    attn_heads = r.int("num_attention_heads")
    kv = r.int("num_key_value_heads", default=None) or attn_heads
    if attn_heads % kv:
        r.fail("num_key_value_heads", f"does not divide num_attention_heads={attn_heads} (valid values divide "
                                      f"{attn_heads})")
    if 2 * hidden % attn_heads:
        r.fail("num_attention_heads", f"the shared attention's head dim is 2 · hidden_size / heads; it must divide "
                                      f"{2 * hidden}")
    for key, want in (("attention_head_dim", 2 * hidden // attn_heads), ("attention_hidden_size", 2 * hidden)):
        if r.get(key) is not None and r.get(key) != want:
            r.fail(key, f"Zamba2's shared attention has it {want} (2 · hidden_size{' / heads' if 'dim' in key else ''})")
    r.get("kv_channels"), r.get("num_query_groups")  # derived (hidden/heads, heads): nothing of their own
    act = r.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        r.fail("hidden_act", f"the shared MLP is gated; valid: {', '.join(ACTIVATIONS)}")
    _flag(r, "gated_linear_unit", True, True, "the shared MLP is gated (GeGLU)")
    attn_adapter = r.bool("use_shared_attention_adapter", None)
    attn_adapter = r.bool("use_shared_attention_lora", False) if attn_adapter is None else attn_adapter
    mlp_adapter = r.bool("use_shared_mlp_adapter", None)
    mlp_adapter = r.bool("use_shared_block_lora", True) if mlp_adapter is None else mlp_adapter
    positions = 16384 if r.bool("use_long_context", False) else r.int("max_position_embeddings", default=4096)
    if r.get("sliding_window") is not None:
        r.fail("sliding_window", "the shared attention over a window is not modelled; valid: null")
    fields.update(
        heads=attn_heads, kv_heads=kv, head_dim=2 * hidden // attn_heads,
        ffn_hidden=r.int("intermediate_size", default=None, or_keys=("ffn_hidden_size",)) or 4 * hidden,
        shared_act=ACTIVATIONS[act], shared_blocks=r.int("num_mem_blocks", default=1),
        shared_attn_adapter=attn_adapter, shared_mlp_adapter=mlp_adapter,
        adapter_rank=r.int("adapter_rank", default=128, or_keys=("lora_rank",)), rope=r.bool("use_mem_rope", False),
        max_positions=positions, seq_len=min(positions, DEFAULT_SEQ_CAP),
    )
    return fields


#: the shared MLP's gated activations: config.json's hidden_act -> the GLU kernel
ACTIVATIONS = {"gelu": "geglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu", "silu": "swiglu",
               "swish": "swiglu"}


READERS = {
    "mamba": HFReader(read=lambda r: read(r, "mamba"),
                      requires=(("hidden_size",), ("num_hidden_layers",), ("vocab_size",), ("state_size",),
                                ("time_step_rank",)),
                      reads=("intermediate_size", "expand", "conv_kernel", "use_bias", "use_conv_bias",
                             "tie_word_embeddings", "hidden_act", "mixer_rms_eps"),
                      model_types=("mamba", "falcon_mamba")),
    "jamba": HFReader(read=lambda r: read(r, "jamba"),
                      requires=(("hidden_size",), ("num_hidden_layers",), ("vocab_size",), ("attn_layer_period",),
                                ("expert_layer_period",), ("mamba_d_state",)),
                      reads=("attn_layer_offset", "expert_layer_offset", "mamba_d_conv", "mamba_expand",
                             "mamba_dt_rank", "mamba_proj_bias", "mamba_conv_bias", "num_attention_heads",
                             "num_key_value_heads", "num_experts", "num_experts_per_tok", "intermediate_size",
                             "max_position_embeddings", "tie_word_embeddings", "sliding_window", "hidden_act"),
                      model_types=("jamba",)),
    "mamba2": HFReader(read=lambda r: read(r, "mamba2"),
                       requires=(("hidden_size",), ("num_hidden_layers",), ("vocab_size",), ("num_heads",),
                                 ("head_dim",), ("state_size",)),
                       reads=("expand", "n_groups", "conv_kernel", "chunk_size", "tie_word_embeddings", "hidden_act",
                              "rms_norm", "use_bias", "use_conv_bias"),
                       model_types=("mamba2",)),
    "zamba2": HFReader(read=lambda r: read(r, "zamba2"),
                       requires=(("hidden_size",), ("num_hidden_layers",), ("vocab_size",), ("layers_block_type",),
                                 ("num_mem_blocks",), ("num_attention_heads",)),
                       reads=("hybrid_layer_ids", "mamba_d_state", "state_size", "mamba_d_conv", "conv_dimension",
                              "mamba_expand", "expansion_factor", "mamba_ngroups", "n_mamba_heads", "mamba_headdim",
                              "chunk_size", "num_key_value_heads", "intermediate_size", "ffn_hidden_size",
                              "hidden_act", "gated_linear_unit", "use_shared_attention_adapter",
                              "use_shared_attention_lora", "use_shared_mlp_adapter", "use_shared_block_lora",
                              "adapter_rank", "lora_rank", "use_mem_rope", "use_long_context",
                              "max_position_embeddings", "tie_word_embeddings", "add_bias_linear",
                              "use_conv_bias", "ft_lora", "sliding_window"),
                       # (attention_head_dim, attention_hidden_size, kv_channels and num_query_groups
                       # are derived values, checked or read, and no evidence of Zamba2: RWKV has an
                       # attention_hidden_size, Megatron-style configs a kv_channels)
                       model_types=("zamba2",)),
    "nemotron_h": HFReader(read=lambda r: read(r, "nemotron_h"),
                           requires=(("hidden_size",), ("vocab_size",), ("hybrid_override_pattern", "layers_block_type")),
                           reads=("num_hidden_layers", "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size",
                                  "conv_kernel", "chunk_size", "num_attention_heads", "num_key_value_heads",
                                  "attention_head_dim", "head_dim", "intermediate_size", "mlp_hidden_act",
                                  "max_position_embeddings", "tie_word_embeddings", "use_bias", "mamba_proj_bias",
                                  "attention_bias", "mlp_bias", "use_conv_bias", "n_routed_experts",
                                  "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
                                  "moe_latent_size"),
                           model_types=("nemotron_h",)),
}


def _jamba_periods(c: HybridConfig) -> dict[str, int]:
    """The periods and offsets of a Jamba pattern's attention and MoE layers (UsageError when it
    has none: a Jamba config.json can only say periodic patterns)."""
    mixers, ffns = c.pattern[0::2], c.pattern[1::2]
    out = {}
    for kind, blocks, ch in (("attn", mixers, "*"), ("expert", ffns, "E")):
        found = next(((p, o) for p in range(1, len(blocks) + 1) for o in range(p)
                      if all((blocks[i] == ch) == (i % p == o) for i in range(len(blocks)))), None)
        if found is None:
            raise UsageError(f"HybridConfig pattern={c.pattern!r}: a Jamba config.json says only periodic "
                             f"{'attention' if ch == '*' else 'MoE'} layers")
        out[f"{kind}_layer_period"], out[f"{kind}_layer_offset"] = found
    return out


def to_hf(config: HybridConfig) -> dict[str, Any]:
    """``config`` as a config.json dict of its family; ``config_from_hf(to_hf(c)) == c`` for the presets."""
    c = config
    out: dict[str, Any] = {"model_type": c.family, "architectures": [ARCHITECTURES[c.family]],
                           "hidden_size": c.hidden, "num_hidden_layers": c.layers, "vocab_size": c.vocab_size,
                           "tie_word_embeddings": c.tie_embeddings}
    if c.family == "mamba":
        out.update(model_type="falcon_mamba", intermediate_size=c.ssm_channels, state_size=c.ssm_state,
                   conv_kernel=c.conv_kernel, time_step_rank=c.dt_rank, use_bias=c.ssm_proj_bias, use_conv_bias=True,
                   hidden_act="silu")
    elif c.family == "jamba":
        out.update(_jamba_periods(c), mamba_expand=c.ssm_channels // c.hidden, mamba_d_state=c.ssm_state,
                   mamba_d_conv=c.conv_kernel, mamba_dt_rank=c.dt_rank, mamba_proj_bias=c.ssm_proj_bias,
                   mamba_conv_bias=True, num_attention_heads=c.heads, num_key_value_heads=c.groups,
                   num_experts=c.experts, num_experts_per_tok=c.experts_per_token, intermediate_size=c.ffn_hidden,
                   max_position_embeddings=c.max_positions, hidden_act="silu")
    elif c.family == "zamba2":
        hybrid = list(c.layer_indices("hybrid"))
        out.update(layers_block_type=["hybrid" if ch == "H" else "mamba" for ch in c.pattern], hybrid_layer_ids=hybrid,
                   mamba_d_state=c.ssm_state, mamba_d_conv=c.conv_kernel, mamba_expand=c.ssm_inner // c.hidden,
                   mamba_ngroups=c.ssm_groups, n_mamba_heads=c.ssm_heads, mamba_headdim=c.ssm_head_dim,
                   chunk_size=c.chunk_size, use_conv_bias=True, add_bias_linear=False,
                   num_attention_heads=c.heads, num_key_value_heads=c.groups,
                   attention_head_dim=c.head_size, attention_hidden_size=2 * c.hidden, intermediate_size=c.ffn_hidden,
                   hidden_act="gelu" if c.shared_act == "geglu" else "silu", num_mem_blocks=c.shared_blocks,
                   use_shared_attention_adapter=c.shared_attn_adapter, use_shared_mlp_adapter=c.shared_mlp_adapter,
                   adapter_rank=c.adapter_rank, use_mem_rope=c.rope, max_position_embeddings=c.max_positions)
    elif c.family == "mamba2":
        out.update(num_heads=c.ssm_heads, head_dim=c.ssm_head_dim, expand=c.ssm_inner // c.hidden,
                   state_size=c.ssm_state, n_groups=c.ssm_groups, conv_kernel=c.conv_kernel, chunk_size=c.chunk_size,
                   rms_norm=True, use_bias=False, use_conv_bias=True, hidden_act="silu")
    else:
        out.update(hybrid_override_pattern=c.pattern, max_position_embeddings=c.max_positions,
                   mamba_num_heads=c.ssm_heads, mamba_head_dim=c.ssm_head_dim, n_groups=c.ssm_groups,
                   ssm_state_size=c.ssm_state, conv_kernel=c.conv_kernel, chunk_size=c.chunk_size,
                   num_attention_heads=c.heads, num_key_value_heads=c.groups, attention_head_dim=c.head_dim,
                   intermediate_size=c.ffn_hidden, mlp_hidden_act="relu2", use_bias=False, use_conv_bias=True)
        if "E" in c.pattern:
            out.update(n_routed_experts=c.experts, num_experts_per_tok=c.experts_per_token,
                       moe_intermediate_size=c.expert_ffn_hidden,
                       moe_shared_expert_intermediate_size=c.shared_expert_ffn_hidden)
    out["stage"] = c.stage_block()
    return out
