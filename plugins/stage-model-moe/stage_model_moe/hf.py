"""Hugging Face ``config.json`` <-> :class:`MoEConfig`, one explicit key table per model type.

Key names differ between the families (Mixtral ``num_local_experts``; Qwen-MoE
``num_experts``, ``moe_intermediate_size``, ``shared_expert_intermediate_size``,
``decoder_sparse_step``, ``mlp_only_layers``; DeepSeek-V3 ``n_routed_experts``,
``n_shared_experts``, ``first_k_dense_replace`` and the MLA ranks).  Contradictory or
missing values raise :class:`UsageError` naming the config.json key.
"""

from __future__ import annotations

from typing import Any

from stage_core.api import HFKeys

from .config import MoEConfig

MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
DEFAULT_SEQ_LEN = 4096


def config_from_hf(hf_config) -> MoEConfig | None:
    """A :class:`MoEConfig` for a Mixtral, Qwen2-MoE, Qwen3-MoE or DeepSeek-V3 config.json.

    Returns ``None`` for any other ``model_type`` (another plugin may handle it).
    """
    r = HFKeys.load(hf_config)
    model_type = r.model_type
    if model_type not in MODEL_TYPES:
        return None
    layers = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", heads)
    if heads % kv_heads:
        r.fail("num_key_value_heads", f"does not divide num_attention_heads={heads}")
    fields: dict[str, Any] = dict(
        name=r.model_name,
        arch=model_type,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        vocab_size=r.int("vocab_size"),
        max_positions=r.int("max_position_embeddings", DEFAULT_SEQ_LEN),
        rope_theta=r.number("rope_theta", 10000.0),
        norm_eps=r.number("rms_norm_eps", 1e-6),
        tie_embeddings=r.bool("tie_word_embeddings", False),
        experts_per_token=r.int("num_experts_per_tok"),
    )
    if r.get("hidden_act", "silu") != "silu":
        r.fail("hidden_act", "the experts are SwiGLU; only 'silu' is supported")

    if model_type == "mixtral":
        experts_key = "num_local_experts"
        width = r.int("intermediate_size")
        fields.update(experts=r.int(experts_key), ffn_hidden=width, expert_ffn_hidden=width,
                      head_dim=_head_dim(r, hidden, heads), norm_topk_prob=True)
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        experts_key = "num_experts"
        mlp_only = r.index_list("mlp_only_layers")
        for i in mlp_only:
            if i >= layers:
                r.fail("mlp_only_layers", f"layer {i} is outside 0..{layers - 1}")
        fields.update(
            experts=r.int(experts_key),
            ffn_hidden=r.int("intermediate_size"),
            expert_ffn_hidden=r.int("moe_intermediate_size"),
            sparse_step=r.int("decoder_sparse_step", 1),
            dense_layers=",".join(str(i) for i in sorted(set(mlp_only))),
            norm_topk_prob=r.bool("norm_topk_prob", False),
            head_dim=_head_dim(r, hidden, heads),
        )
        if model_type == "qwen2_moe":
            shared = r.int("shared_expert_intermediate_size", 0, minimum=0)
            fields.update(shared_expert_ffn_hidden=shared, shared_expert_gate=shared > 0,
                          qkv_bias=r.bool("qkv_bias", True))
        else:
            fields.update(qk_norm=True, qkv_bias=r.bool("attention_bias", False))
    else:  # deepseek_v3
        experts_key = "n_routed_experts"
        width = r.int("moe_intermediate_size")
        if r.int("moe_layer_freq", 1) != 1:
            r.fail("moe_layer_freq", "only 1 (every layer after first_k_dense_replace is MoE) is supported")
        score = r.get("scoring_func", "sigmoid")
        if score not in ("softmax", "sigmoid"):
            r.fail("scoring_func", "valid values are softmax, sigmoid")
        experts = r.int(experts_key)
        groups = r.int("n_group", 1)
        if experts % groups:
            r.fail("n_group", f"does not divide n_routed_experts={experts}")
        topk_groups = r.int("topk_group", 1)
        if topk_groups > groups:
            r.fail("topk_group", f"exceeds n_group={groups}")
        q_lora = r.get("q_lora_rank")
        fields.update(
            experts=experts,
            ffn_hidden=r.int("intermediate_size"),
            expert_ffn_hidden=width,
            shared_expert_ffn_hidden=r.int("n_shared_experts", 0, minimum=0) * width,
            first_dense_layers=r.int("first_k_dense_replace", 0, minimum=0),
            router_score=score,
            norm_topk_prob=r.bool("norm_topk_prob", True),
            routed_scaling_factor=r.number("routed_scaling_factor", 1.0),
            router_selection_bias=r.get("topk_method") == "noaux_tc",
            expert_groups=groups,
            topk_groups=topk_groups,
            attention_type="mla",
            q_lora_rank=None if q_lora is None else r.int("q_lora_rank"),
            kv_lora_rank=r.int("kv_lora_rank"),
            qk_nope_head_dim=r.int("qk_nope_head_dim"),
            qk_rope_head_dim=r.int("qk_rope_head_dim"),
            v_head_dim=r.int("v_head_dim"),
            mtp_layers=r.int("num_nextn_predict_layers", 0, minimum=0),
        )
        if fields["first_dense_layers"] > layers:
            r.fail("first_k_dense_replace", f"exceeds num_hidden_layers={layers}")
    if fields["experts_per_token"] > fields["experts"]:
        r.fail("num_experts_per_tok", f"exceeds {experts_key}={fields['experts']}: top-k picks at most every expert")
    # config.json has no training length: the default is 4096 tokens, or fewer if the
    # model has fewer positions
    fields["seq_len"] = min(DEFAULT_SEQ_LEN, fields["max_positions"])
    return r.make(MoEConfig, fields)


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


def to_hf(cfg: MoEConfig) -> dict[str, Any]:
    """``cfg`` as a Hugging Face config.json dict of ``model_type`` ``cfg.arch``."""
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
