"""Hugging Face ``config.json`` <-> :class:`MoEConfig`, read by its keys.

Any config.json with a decoder's keys and experts reads here, whatever its
``model_type``: the host picks this family when a config has an expert count
(``num_local_experts``, ``num_experts`` or ``n_routed_experts``) and experts per token
(``num_experts_per_tok``, ``experts_per_token``).  Keys, with the other names models use:

* shape: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
  ``num_key_value_heads``, ``head_dim``, ``vocab_size``, ``max_position_embeddings``,
  ``tie_word_embeddings``; a multimodal config's decoder under ``text_config`` (Llama 4:
  the vision tower's keys are listed as ignored).
* experts: the expert width ``moe_intermediate_size`` (else ``intermediate_size``); the
  dense MLPs' width ``intermediate_size`` (``intermediate_size_mlp`` where
  ``intermediate_size`` is the experts', Llama 4); shared experts ``n_shared_experts`` x
  the expert width (DeepSeek) or ``shared_expert_intermediate_size``; dense layers
  ``first_k_dense_replace``, ``mlp_only_layers``, ``decoder_sparse_step`` or
  ``interleave_moe_layer_step`` (every n-th layer MoE), ``moe_layer_freq`` (1 only);
  router ``scoring_func``, ``topk_method`` (``noaux_tc``: the balancing bias),
  ``n_group``, ``topk_group``, ``norm_topk_prob``, ``routed_scaling_factor``.
* attention: MLA when ``kv_lora_rank`` is there (``q_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``), else GQA; ``attention_bias`` (q, k, v and the
  output projection), ``qkv_bias``; ``lm_head_bias``; local layers from
  ``sliding_window`` with ``layer_types`` (gpt-oss alternates them), and Llama 4's chunked
  attention ``attention_chunk_size`` with ``no_rope_layers`` (its global layers have no
  rotary embedding): a chunk of C tokens is counted as a sliding window of C/2 keys, the
  same (query, key) pairs as the chunks for sequences much longer than C.

What a config.json has no key for comes from its ``model_type`` (:data:`ARCH`): Qwen2-MoE's
q, k, v biases and gated shared expert, Qwen3-MoE's per-head and OLMoE's all-head q/k
norms, Phi-3.5-MoE's LayerNorm, gpt-oss's router and expert biases and attention sinks,
Llama 4's sigmoid router and shared expert.  Contradictory or missing values raise
:class:`UsageError` naming the config.json key.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from stage_core.api import HFKeys, HFReader, UsageError, load_hf_config

from .config import ARCHS, EXPORT_ARCHS, MoEConfig

MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe", "phimoe", "gpt_oss",
               "llama4", "llama4_text")
DEFAULT_SEQ_LEN = 4096
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
PER_TOKEN_KEYS = ("num_experts_per_tok", "experts_per_token")

#: what each model_type implies that its config.json has no key for
ARCH: dict[str, dict[str, Any]] = {
    "qwen2_moe": {"qkv_bias": True, "shared_gate": True, "norm_topk_prob": False},
    "qwen3_moe": {"qk_norm": "head", "norm_topk_prob": False},
    "olmoe": {"qk_norm": "all", "norm_topk_prob": False},
    "phimoe": {"norm": "layernorm"},
    "gpt_oss": {"router_bias": True, "expert_bias": True, "attn_sinks": True},
    "llama4": {"router_score": "sigmoid", "shared_expert": True, "norm_topk_prob": False},
}
ARCH["llama4_text"] = ARCH["llama4"]


def read(top: HFKeys) -> MoEConfig:
    """A :class:`MoEConfig` from a config.json's keys (raises UsageError naming a key)."""
    nested = isinstance(top.data.get("text_config"), Mapping) and "hidden_size" not in top.data
    r = top.child("text_config") if nested else top
    model_type = top.model_type
    arch = ARCH.get(model_type, {})
    layers = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", heads)
    if heads % kv_heads:
        r.fail("num_key_value_heads", f"does not divide num_attention_heads={heads}")
    experts = r.int(EXPERT_KEYS[0], or_keys=EXPERT_KEYS[1:])
    experts_key = next(k for k in EXPERT_KEYS if r.data.get(k) is not None)
    per_token = r.int(PER_TOKEN_KEYS[0], or_keys=PER_TOKEN_KEYS[1:])
    if per_token > experts:
        r.fail(next(k for k in PER_TOKEN_KEYS if r.data.get(k) is not None),
               f"exceeds {experts_key}={experts}: top-k picks at most every expert")
    if r.get("hidden_act", "silu") not in ("silu", "swish"):
        r.fail("hidden_act", "the experts are SwiGLU; only 'silu' is supported")
    expert_width = r.int("moe_intermediate_size", default=None)
    if expert_width is None:
        expert_width = r.int("intermediate_size")
        dense_width = r.int("intermediate_size_mlp", default=expert_width)
    else:
        dense_width = r.int("intermediate_size")
    fields: dict[str, Any] = dict(
        name=top.model_name,
        arch=model_type if model_type in ARCHS else "moe",
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        vocab_size=r.int("vocab_size"),
        vocab_pad_to=1,  # the table as the checkpoint stores it
        max_positions=r.int("max_position_embeddings", DEFAULT_SEQ_LEN),
        rope_theta=r.number("rope_theta", 10000.0),
        norm_eps=r.number("rms_norm_eps", 1e-6),
        tie_embeddings=top.bool("tie_word_embeddings", r.bool("tie_word_embeddings", False)),
        experts=experts,
        experts_per_token=per_token,
        expert_ffn_hidden=expert_width,
        ffn_hidden=dense_width,
        **_layers(r, layers),
        **_shared(r, arch, expert_width),
        **_router(r, arch, experts),
        **_attention(r, arch, layers, hidden, heads),
        norm=arch.get("norm", "rmsnorm"),
        norm_bias=arch.get("norm") == "layernorm",
        lm_head_bias=r.bool("lm_head_bias", False),
        router_bias=arch.get("router_bias", False),
        expert_bias=arch.get("expert_bias", False),
    )
    r.get("swiglu_limit")  # gpt-oss clamps its SwiGLU: the same kernel
    # config.json has no training length: the default is 4096 tokens, or fewer if the
    # model has fewer positions
    fields["seq_len"] = min(DEFAULT_SEQ_LEN, fields["max_positions"])
    return top.make(MoEConfig, fields)


def _layers(r: HFKeys, layers: int) -> dict[str, Any]:
    """Which layers are dense: DeepSeek's first k, Qwen's list and step, Llama 4's step."""
    if r.int("moe_layer_freq", 1) != 1:
        r.fail("moe_layer_freq", "only 1 (every layer after first_k_dense_replace is MoE) is supported")
    mlp_only = r.index_list("mlp_only_layers")
    for i in mlp_only:
        if i >= layers:
            r.fail("mlp_only_layers", f"layer {i} is outside 0..{layers - 1}")
    first = r.int("first_k_dense_replace", 0, minimum=0)
    if first > layers:
        r.fail("first_k_dense_replace", f"exceeds num_hidden_layers={layers}")
    step = r.int("decoder_sparse_step", default=None)
    step = r.int("interleave_moe_layer_step", default=step or 1)
    dense = set(mlp_only)
    moe_layers = r.get("moe_layers")
    if moe_layers is not None:  # an explicit list (Llama 4 configs may carry it)
        listed = r.index_list("moe_layers")
        dense |= {i for i in range(layers) if i not in listed and (i + 1) % step == 0 and i >= first}
    return {"first_dense_layers": first, "sparse_step": step, "dense_layers": ",".join(map(str, sorted(dense)))}


def _shared(r: HFKeys, arch: Mapping[str, Any], width: int) -> dict[str, Any]:
    shared = r.int("n_shared_experts", 0, minimum=0) * width
    shared = r.int("shared_expert_intermediate_size", shared, minimum=0)
    if arch.get("shared_expert") and not shared:
        shared = width  # Llama 4: one shared expert beside the routed ones in every MoE layer
    return {"shared_expert_ffn_hidden": shared, "shared_expert_gate": bool(arch.get("shared_gate")) and shared > 0}


def _router(r: HFKeys, arch: Mapping[str, Any], experts: int) -> dict[str, Any]:
    score = r.get("scoring_func", arch.get("router_score", "softmax"))
    if score not in ("softmax", "sigmoid"):
        r.fail("scoring_func", "valid values are softmax, sigmoid")
    groups = r.int("n_group", 1)
    if experts % groups:
        r.fail("n_group", f"does not divide the {experts} experts")
    topk_groups = r.int("topk_group", 1)
    if topk_groups > groups:
        r.fail("topk_group", f"exceeds n_group={groups}")
    method = r.get("topk_method")
    return {"router_score": score, "norm_topk_prob": r.bool("norm_topk_prob", arch.get("norm_topk_prob", True)),
            "routed_scaling_factor": r.number("routed_scaling_factor", 1.0),
            "router_selection_bias": method == "noaux_tc", "expert_groups": groups, "topk_groups": topk_groups}


def _attention(r: HFKeys, arch: Mapping[str, Any], layers: int, hidden: int, heads: int) -> dict[str, Any]:
    if r.get("kv_lora_rank") is not None:  # DeepSeek's multi-head latent attention
        q_lora = r.get("q_lora_rank")
        return dict(attention_type="mla", q_lora_rank=None if q_lora is None else r.int("q_lora_rank"),
                    kv_lora_rank=r.int("kv_lora_rank"), qk_nope_head_dim=r.int("qk_nope_head_dim"),
                    qk_rope_head_dim=r.int("qk_rope_head_dim"), v_head_dim=r.int("v_head_dim"),
                    mtp_layers=r.int("num_nextn_predict_layers", 0, minimum=0))
    both = r.bool("attention_bias", False)
    qk = arch.get("qk_norm")
    out = dict(head_dim=_head_dim(r, hidden, heads), qkv_bias=r.bool("qkv_bias", both or arch.get("qkv_bias", False)),
               proj_bias=both, qk_norm=qk is not None, qk_norm_span=qk or "head",
               attn_sinks=arch.get("attn_sinks", False))
    r.get("use_qk_norm")  # Llama 4's L2 norm of q and k has no weights
    chunk = r.int("attention_chunk_size", default=None)
    if chunk is not None:  # Llama 4: chunked attention, every layer but the NoPE ones
        interval = r.int("no_rope_layer_interval", 4)
        every = r.global_every("no_rope_layers", layers, interval, local=(1,), full=(0,))
        return {**out, "sliding_window": max(1, chunk // 2), "global_every": every or 0, "rope_global": False}
    use = r.get("use_sliding_window")
    window = r.int("sliding_window", default=None)
    if use is not None:
        r.get("max_window_layers")
        if r.bool("use_sliding_window", False):
            r.fail("use_sliding_window", "a window on the layers from max_window_layers on is not modelled; "
                                         "valid: false")
        window = None
    if window is None:
        r.get("layer_types")
        return out
    every = r.global_every("layer_types", layers, 0)
    if every is None:
        return out
    return {**out, "sliding_window": window, "global_every": every}


def _head_dim(r: HFKeys, hidden: int, heads: int) -> int | None:
    """``head_dim`` when config.json gives one that differs from hidden/heads, else None (derived)."""
    head_dim = r.int("head_dim", None)
    if head_dim is None:
        if hidden % heads:
            r.fail("num_attention_heads", f"does not divide hidden_size={hidden} and no head_dim is given")
        return None
    if hidden % heads == 0 and head_dim == hidden // heads:
        return None
    return head_dim


READER = HFReader(
    read=read,
    requires=(("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("vocab_size",), EXPERT_KEYS,
              PER_TOKEN_KEYS),
    reads=("num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings", "hidden_act",
           "intermediate_size", "moe_intermediate_size", "intermediate_size_mlp", "n_shared_experts",
           "shared_expert_intermediate_size", "first_k_dense_replace", "mlp_only_layers", "decoder_sparse_step",
           "interleave_moe_layer_step", "moe_layer_freq", "moe_layers", "scoring_func", "topk_method", "n_group",
           "topk_group", "norm_topk_prob", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
           "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_nextn_predict_layers", "attention_bias",
           "qkv_bias", "lm_head_bias", "use_qk_norm", "attention_chunk_size", "no_rope_layers",
           "no_rope_layer_interval", "sliding_window",
           "use_sliding_window", "max_window_layers", "layer_types", "swiglu_limit", "rope_theta", "rms_norm_eps"),
    model_types=MODEL_TYPES,
)


def config_from_hf(source: Mapping[str, Any] | str | os.PathLike) -> MoEConfig | None:
    """A :class:`MoEConfig` from a config.json (dict or path) with a decoder's keys and experts;
    ``None`` for one without them."""
    data, label = load_hf_config(source)
    if not READER.can_read(data):
        return None
    return read(HFKeys(data, label))


def to_hf(cfg: MoEConfig) -> dict[str, Any]:
    """``cfg`` as a Hugging Face config.json dict of ``model_type`` ``cfg.arch`` (one of
    :data:`~stage_model_moe.config.EXPORT_ARCHS`)."""
    if cfg.arch not in EXPORT_ARCHS:
        raise UsageError(f"MoEConfig arch={cfg.arch!r}: config.json export covers {', '.join(EXPORT_ARCHS)}")
    out: dict[str, Any] = {
        "_name_or_path": cfg.name,
        "model_type": cfg.arch,
        "hidden_act": "silu",
        "num_hidden_layers": cfg.layers,
        "hidden_size": cfg.hidden,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_positions,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "num_experts_per_tok": cfg.experts_per_token,
    }
    dense = sorted(set(range(cfg.first_dense_layers)) | set(cfg.dense_layer_indices))
    if cfg.arch == "mixtral":
        out.update(architectures=["MixtralForCausalLM"], num_local_experts=cfg.experts,
                   intermediate_size=cfg.expert_ffn_hidden)
        if cfg.head_dim is not None:
            out["head_dim"] = cfg.head_dim
    elif cfg.arch in ("qwen2_moe", "qwen3_moe"):
        out.update(num_experts=cfg.experts, intermediate_size=cfg.ffn_hidden,
                   moe_intermediate_size=cfg.expert_ffn_hidden, decoder_sparse_step=cfg.sparse_step,
                   mlp_only_layers=dense, norm_topk_prob=cfg.norm_topk_prob)
        if cfg.head_dim is not None:
            out["head_dim"] = cfg.head_dim
        if cfg.arch == "qwen2_moe":
            out.update(architectures=["Qwen2MoeForCausalLM"],
                       shared_expert_intermediate_size=cfg.shared_expert_ffn_hidden, qkv_bias=cfg.qkv_bias)
        else:
            out.update(architectures=["Qwen3MoeForCausalLM"], attention_bias=cfg.qkv_bias)
    else:
        out.update(
            architectures=["DeepseekV3ForCausalLM"],
            n_routed_experts=cfg.experts,
            n_shared_experts=cfg.shared_expert_ffn_hidden // cfg.expert_ffn_hidden,
            intermediate_size=cfg.ffn_hidden,
            moe_intermediate_size=cfg.expert_ffn_hidden,
            first_k_dense_replace=cfg.first_dense_layers,
            moe_layer_freq=1,
            scoring_func=cfg.router_score,
            norm_topk_prob=cfg.norm_topk_prob,
            routed_scaling_factor=cfg.routed_scaling_factor,
            topk_method="noaux_tc" if cfg.router_selection_bias else "greedy",
            n_group=cfg.expert_groups,
            topk_group=cfg.topk_groups,
            q_lora_rank=cfg.q_lora_rank,
            kv_lora_rank=cfg.kv_lora_rank,
            qk_nope_head_dim=cfg.qk_nope_head_dim,
            qk_rope_head_dim=cfg.qk_rope_head_dim,
            v_head_dim=cfg.v_head_dim,
            num_nextn_predict_layers=cfg.mtp_layers,
        )
    out["stage"] = cfg.stage_block()
    return out
