"""MoEConfig: one config for the mixture-of-experts decoders (Mixtral, Qwen-MoE, DeepSeek-V3).

The fields are plain values.  ``arch`` names the Hugging Face ``model_type`` the config
mirrors (it decides the key names of :meth:`MoEConfig.to_hf`); the graph depends only on
the other fields, so any combination that passes validation builds.  Derived sizes
(head dim, padded vocabulary, which layers are MoE) are properties, so a ``--set``
override never leaves a stale derived value behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from stage_core.api import (ATTENTION_KINDS, DTYPES, ModelConfig, UsageError, check_at_most, check_bool, check_choice,
                            check_divides, check_int, check_positive_number, check_str, padded)

FAMILY = "moe"
#: the model_types whose config.json :meth:`MoEConfig.to_hf` writes
EXPORT_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
#: every model_type a config may mirror (the others are read, not written)
ARCHS = EXPORT_ARCHS + ("deepseek_v2", "olmoe", "phimoe", "gpt_oss", "llama4", "moe")
NORMS = ("rmsnorm", "layernorm")
QK_NORM_SPANS = ("head", "all")
ATTENTION_TYPES = ("gqa", "mla")
ROUTER_SCORES = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoEConfig(ModelConfig):
    """A pre-RMSNorm decoder whose MLPs are (mostly) mixtures of SwiGLU experts.

    Attention: ``attention_type="gqa"`` (fused QKV, RoPE, optional per-head q/k RMSNorm
    ``qk_norm`` and QKV bias ``qkv_bias``) or ``"mla"`` (DeepSeek multi-head latent
    attention: ``q_lora_rank`` (None: a plain q projection), ``kv_lora_rank``,
    ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``).  ``attention``:
    ``"flash"`` (one fused kernel) or ``"classic"`` (scores, softmax, context);
    ``causal_flops`` halves the score FLOPs.

    MLP of layer i: dense SwiGLU of width ``ffn_hidden`` when i < ``first_dense_layers``
    (DeepSeek's first_k_dense_replace), when i is listed in ``dense_layers`` (comma
    separated; Qwen's mlp_only_layers) or when (i + 1) is not a multiple of
    ``sparse_step`` (Qwen's decoder_sparse_step); otherwise a MoE block: router over
    ``experts`` (``router_score`` softmax or sigmoid; top ``experts_per_token``;
    ``norm_topk_prob`` renormalises the kept weights, ``routed_scaling_factor`` scales
    them, ``router_selection_bias`` adds DeepSeek-V3's balancing bias before the choice),
    ``experts`` SwiGLU experts of width ``expert_ffn_hidden`` and, when
    ``shared_expert_ffn_hidden`` > 0, a shared SwiGLU MLP of that (total) width, gated by
    a sigmoid when ``shared_expert_gate`` (Qwen2-MoE).  ``capacity_factor``: None for
    dropless routing (each expert gets its uniform-routing share of the tokens, in whole
    rows), else every expert is padded to Megatron's capacity
    ⌈tokens·k·capacity_factor/experts⌉ of each rank's tokens.

    Further options the 2024-25 MoE models need: ``qk_norm_span`` (``head``: each head
    over d; ``all``: all heads together, OLMoE); ``norm`` and ``norm_bias`` (Phi-3.5-MoE's
    LayerNorm); ``proj_bias`` (the attention output projection's bias), ``lm_head_bias``,
    ``router_bias`` and ``expert_bias`` (biases of the router and of every expert
    projection, gpt-oss); ``attn_sinks`` (a learned logit per head that takes part in
    the softmax, gpt-oss: one parameter per head, and a kernel rescaling the context);
    ``sliding_window`` with ``global_every`` (local attention in the layers where (i + 1)
    is not a multiple of ``global_every``; 0: every layer local), as gpt-oss alternates
    them and Llama 4 keeps every fourth layer global; ``rope_global`` false drops the
    rotary embedding from the global layers (Llama 4's NoPE layers).

    ``mtp_layers`` (DeepSeek's num_nextn_predict_layers) is kept for the Hugging Face
    round trip only: the multi-token-prediction module is not part of the built graph.
    ``max_positions``, ``rope_theta``, ``norm_eps``, ``expert_groups`` and
    ``topk_groups`` are likewise carried for the round trip and cost nothing.
    """

    HF_STAGE_KEYS = ModelConfig.HF_STAGE_KEYS + ("capacity_factor",)

    name: str = "moe-tiny"
    family: str = FAMILY
    arch: str = "mixtral"
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int | None = None  # None: hidden / heads
    ffn_hidden: int = 256
    vocab_size: int = 512
    vocab_pad_to: int = 128
    # experts
    experts: int = 4
    experts_per_token: int = 2
    expert_ffn_hidden: int = 256
    shared_expert_ffn_hidden: int = 0
    shared_expert_gate: bool = False
    first_dense_layers: int = 0
    sparse_step: int = 1
    dense_layers: str = ""
    router_score: str = "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    router_selection_bias: bool = False
    expert_groups: int = 1
    topk_groups: int = 1
    capacity_factor: float | None = None
    # attention
    attention_type: str = "gqa"
    qk_norm: bool = False
    qkv_bias: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mla_absorbed: bool = False  # MLA in its decode form: attention over the latent (see for_task)
    qk_norm_span: str = "head"
    norm: str = "rmsnorm"
    norm_bias: bool = False
    proj_bias: bool = False
    lm_head_bias: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    attn_sinks: bool = False
    sliding_window: int | None = None
    global_every: int = 0
    rope_global: bool = True
    # carried for the Hugging Face round trip
    max_positions: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    mtp_layers: int = 0
    # training
    seq_len: int = 4096
    tie_embeddings: bool = False
    attention: str = "flash"
    causal_flops: bool = False
    dtype: str = "bf16"

    def __post_init__(self):
        cls = type(self).__name__
        check_str(self, "name")
        if self.family != FAMILY:
            raise UsageError(f"{cls} family={self.family!r}: a MoE config's family must be {FAMILY!r}")
        check_choice(self, "arch", ARCHS)
        check_int(self, "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab_size", "vocab_pad_to",
                  "experts", "experts_per_token", "expert_ffn_hidden", "sparse_step", "expert_groups",
                  "topk_groups", "max_positions", "seq_len")
        check_int(self, "shared_expert_ffn_hidden", "first_dense_layers", "mtp_layers", minimum=0)
        check_bool(self, "shared_expert_gate", "norm_topk_prob", "router_selection_bias", "qk_norm", "qkv_bias",
                   "tie_embeddings", "causal_flops", "mla_absorbed", "norm_bias", "proj_bias", "lm_head_bias",
                   "router_bias", "expert_bias", "attn_sinks", "rope_global")
        check_choice(self, "norm", NORMS)
        check_choice(self, "qk_norm_span", QK_NORM_SPANS)
        check_int(self, "sliding_window", optional=True)
        check_int(self, "global_every", minimum=0)
        check_positive_number(self, "routed_scaling_factor", "rope_theta", "norm_eps")
        check_positive_number(self, "capacity_factor", optional=True)
        check_choice(self, "router_score", ROUTER_SCORES)
        check_choice(self, "attention_type", ATTENTION_TYPES)
        check_choice(self, "attention", ATTENTION_KINDS)
        check_choice(self, "dtype", DTYPES)

        check_at_most(self, "experts_per_token", "experts", f"valid values are 1..{self.experts}")
        check_at_most(self, "topk_groups", "expert_groups", f"valid values are 1..{self.expert_groups}")
        check_divides(self, "expert_groups", "experts")
        check_divides(self, "kv_heads", "heads", f"valid KV head counts divide {self.heads}")
        check_at_most(self, "first_dense_layers", "layers", f"valid values are 0..{self.layers}")
        for i in self.dense_layer_indices:
            if not 0 <= i < self.layers:
                raise UsageError(
                    f"{cls} dense_layers={self.dense_layers!r}: layer {i} is outside 0..{self.layers - 1}"
                )

        if self.attention_type == "gqa":
            if self.mla_absorbed:
                raise UsageError(f"{cls} mla_absorbed=True: absorption applies to attention_type 'mla' only")
            if self.head_dim is None:
                check_divides(self, "heads", "hidden", f"the head dim is hidden/heads unless head_dim is given; "
                                                       f"valid head counts divide {self.hidden}")
            else:
                check_int(self, "head_dim")
        else:
            check_int(self, "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                      why="multi-head latent attention needs it")
            check_int(self, "q_lora_rank", optional=True)
            if self.qkv_bias or self.qk_norm or self.proj_bias or self.attn_sinks or self.sliding_window:
                raise UsageError(f"{cls} attention_type='mla' has no qkv_bias, qk_norm, proj_bias, attn_sinks or "
                                 f"sliding_window; set them off")
            if self.kv_heads != self.heads:
                raise UsageError(
                    f"{cls} kv_heads={self.kv_heads}: multi-head latent attention decompresses one key and "
                    f"value per head, so kv_heads must equal heads={self.heads}"
                )

        if self.shared_expert_gate and not self.shared_expert_ffn_hidden:
            raise UsageError(f"{cls} shared_expert_gate=True needs shared_expert_ffn_hidden > 0")
        if self.arch.startswith("deepseek") and self.shared_expert_ffn_hidden % self.expert_ffn_hidden:
            raise UsageError(
                f"{cls} shared_expert_ffn_hidden={self.shared_expert_ffn_hidden}: DeepSeek's shared experts "
                f"are n_shared_experts × expert_ffn_hidden={self.expert_ffn_hidden}; use a multiple of it"
            )

    def for_task(self, task: str) -> "MoEConfig":
        """Decode runs MLA absorbed (DeepSeek-V2 §2.1.2, as its inference kernels do): the key
        up-projection folded into the query and the value up-projection into the output, so
        each step attends over the cached latent and rope key instead of decompressing every
        cached token's keys and values per head.  Training and prefill keep the training
        form (decompressing is cheaper when the queries are as many as the keys)."""
        if task == "decode" and self.attention_type == "mla" and not self.mla_absorbed:
            return self.replace(mla_absorbed=True)
        return self

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_size(self) -> int:
        """The GQA head dim d (``head_dim``, or hidden / heads)."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def padded_vocab(self) -> int:
        return padded(self.vocab_size, self.vocab_pad_to)

    @property
    def dense_layer_indices(self) -> tuple[int, ...]:
        text = self.dense_layers.strip() if isinstance(self.dense_layers, str) else None
        if text is None:
            raise UsageError(f"MoEConfig dense_layers={self.dense_layers!r}: expected comma-separated layer indices")
        if not text:
            return ()
        try:
            return tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
        except ValueError:
            raise UsageError(
                f"MoEConfig dense_layers={self.dense_layers!r}: expected comma-separated layer indices"
            ) from None

    def is_local(self, i: int) -> bool:
        """Whether layer ``i`` attends through the sliding window."""
        return self.sliding_window is not None and (self.global_every == 0 or (i + 1) % self.global_every != 0)

    def is_moe_layer(self, i: int) -> bool:
        return (
            i >= self.first_dense_layers
            and (i + 1) % self.sparse_step == 0
            and i not in self.dense_layer_indices
        )

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.layers) if self.is_moe_layer(i))

    @property
    def kv_cache_elements_per_token_per_layer(self) -> int:
        """Elements a decoder caches per token per layer: 2·g·d (GQA) or rkv + dr (MLA, the latent)."""
        if self.attention_type == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_size

    def dims(self) -> dict[str, int]:
        """Numeric values of the model's dims (every dim but the plan's ``b`` and ``s``).

        h hidden, a heads, V padded vocabulary, E experts, k experts per token, fe expert
        FFN width; f the dense FFN width (only with dense layers); fs the shared experts'
        total width (only with shared experts); GQA: g KV heads, d head dim; MLA: rq
        (with a q rank), rkv, dn, dr, dv.
        """
        out = {
            "h": self.hidden,
            "a": self.heads,
            "V": self.padded_vocab,
            "E": self.experts,
            "k": self.experts_per_token,
            "fe": self.expert_ffn_hidden,
        }
        if len(self.moe_layers) < self.layers:
            out["f"] = self.ffn_hidden  # the dense layers' FFN width
        if self.shared_expert_ffn_hidden:
            out["fs"] = self.shared_expert_ffn_hidden
        if self.attention_type == "gqa":
            out.update(g=self.kv_heads, d=self.head_size)
        else:
            out.update(rkv=self.kv_lora_rank, dn=self.qk_nope_head_dim, dr=self.qk_rope_head_dim,
                       dv=self.v_head_dim)
            if self.q_lora_rank is not None:
                out["rq"] = self.q_lora_rank
        return out

    def to_hf(self) -> dict:
        """This config as a Hugging Face ``config.json`` dict (``model_type`` = ``arch``)."""
        from .hf import to_hf

        return to_hf(self)

