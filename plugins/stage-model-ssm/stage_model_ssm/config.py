"""HybridConfig: Mamba-2 models and hybrid stacks of Mamba-2, attention, MLP and MoE layers.

A stack is a layer pattern string, one character per layer (Nemotron-H's
``hybrid_override_pattern``): ``M`` a Mamba-2 layer, ``*`` an attention layer, ``-`` an
MLP layer, ``E`` a mixture-of-experts layer.  A pure Mamba-2 model is all ``M``.  Every
layer is pre-RMSNorm with a residual add.  Jamba-style stacks, where a layer holds a
mixer and an FFN, are the same pattern with two characters per layer (``M-``, ``ME``,
``*E``...).  ``H`` is a Zamba2 hybrid layer: one of the model's shared transformer
blocks (its weights stored once, reused at every ``H``), a per-layer linear, then a
Mamba layer.  ``family`` names the Hugging Face ``model_type`` the config mirrors.
"""

from __future__ import annotations

from dataclasses import dataclass

from stage_core.api import (ATTENTION_KINDS, DTYPES, GLU_KINDS, ModelConfig, UsageError, check_at_most, check_bool, check_choice,
                            check_divides, check_int, check_str, padded)

FAMILIES = ("mamba2", "nemotron_h", "mamba", "jamba", "zamba2")
SSM_VERSIONS = (1, 2)
LAYER_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe", "H": "hybrid"}
#: the layers that hold a Mamba mixer (and its recurrent state)
MIXER_KINDS = ("mamba", "hybrid")
MLP_ACTS = ("relu2", "swiglu")
ROUTER_SCORES = ("softmax", "sigmoid")


@dataclass(frozen=True)
class HybridConfig(ModelConfig):
    """A Mamba-2 or hybrid model.

    Mamba-2 mixer: ``ssm_heads`` heads of ``ssm_head_dim`` (d_inner = heads · head dim),
    in ``ssm_groups`` groups sharing B and C (the heads divide into groups), state size
    ``ssm_state``, a depthwise causal conv of ``conv_kernel`` taps, the SSD scan in chunks
    of ``chunk_size`` tokens.  Attention (``*``): ``heads``, ``kv_heads``, ``head_dim``
    (None: hidden/heads), RoPE when ``rope`` (Nemotron-H has none).  MLP (``-``):
    ``ffn_hidden`` with ``mlp_act`` relu2 (up, squared ReLU, down: Nemotron-H) or swiglu.
    MoE (``E``): ``experts`` of width ``expert_ffn_hidden`` (same activation), top
    ``experts_per_token`` by ``router_score``, a shared expert of ``shared_expert_ffn_hidden``
    when > 0.  The vocabulary is padded to a multiple of ``vocab_pad_to``.

    ``ssm_version`` 1 makes the ``M`` layers Mamba-1 (Gu & Dao 2023): ``ssm_channels``
    channels (d_inner), a state of ``ssm_state`` per channel, Δ of rank ``dt_rank``, the
    selective scan as one registered kernel (:mod:`stage_model_ssm.scan`); ``ssm_dt_norm``
    adds Jamba's RMSNorms (with weights) of Δ, B and C; ``ssm_proj_bias`` biases in_proj
    and out_proj; ``conv_bias`` the conv.  ``blocks_per_layer`` pattern characters make one
    model layer (Jamba: 2, a mixer and an FFN, each with its norm and residual add).

    Zamba2 (``H`` layers): ``shared_blocks`` transformer blocks used in turn (ABAB) by the
    ``H`` layers, each block's weights held once.  A block reads the residual stream
    joined with the model's embeddings (width 2·hidden): RMSNorm, attention of ``heads``
    (``kv_heads``) heads of ``head_dim`` (2·hidden/heads), RoPE when ``rope``; RMSNorm, a
    gated MLP (``shared_act``, geglu or swiglu) of ``ffn_hidden``.  Per use (not shared):
    LoRA adapters of rank ``adapter_rank`` on the gate/up projection when
    ``shared_mlp_adapter`` and on q, k and v when ``shared_attn_adapter``, and the linear
    [h, h] whose output joins the input of the layer's Mamba mixer.
    """

    name: str = "hybrid-tiny"
    family: str = "nemotron_h"
    pattern: str = "M*-E"
    hidden: int = 128
    vocab_size: int = 512
    vocab_pad_to: int = 1
    # Mamba-2
    ssm_heads: int = 8
    ssm_head_dim: int = 32
    ssm_groups: int = 2
    ssm_state: int = 16
    conv_kernel: int = 4
    chunk_size: int = 64
    # Mamba-1
    ssm_version: int = 2
    ssm_channels: int = 0
    dt_rank: int = 0
    ssm_dt_norm: bool = False
    ssm_proj_bias: bool = False
    conv_bias: bool = True
    blocks_per_layer: int = 1
    # attention
    heads: int = 4
    kv_heads: int | None = 2
    head_dim: int | None = None
    rope: bool = False
    # MLP and MoE
    ffn_hidden: int = 256
    mlp_act: str = "relu2"
    experts: int = 4
    experts_per_token: int = 2
    expert_ffn_hidden: int = 128
    shared_expert_ffn_hidden: int = 0
    router_score: str = "softmax"
    # Zamba2's shared transformer blocks
    shared_blocks: int = 1
    shared_act: str = "geglu"
    shared_mlp_adapter: bool = True
    shared_attn_adapter: bool = False
    adapter_rank: int = 128
    # training
    max_positions: int | None = None
    seq_len: int = 256
    tie_embeddings: bool = False
    attention: str = "flash"
    causal_flops: bool = False
    dtype: str = "bf16"

    def __post_init__(self):
        check_str(self, "name", "pattern")
        check_choice(self, "family", FAMILIES)
        bad = sorted(set(self.pattern) - set(LAYER_KINDS))
        if not self.pattern or bad:
            raise UsageError(f"HybridConfig pattern={self.pattern!r}: one character per layer, each of "
                             f"{', '.join(repr(k) + ' ' + v for k, v in LAYER_KINDS.items())}")
        check_int(self, "hidden", "vocab_size", "vocab_pad_to", "ssm_heads", "ssm_head_dim", "ssm_groups",
                  "ssm_state", "conv_kernel", "chunk_size", "heads", "ffn_hidden", "experts", "experts_per_token",
                  "expert_ffn_hidden", "seq_len", "shared_blocks", "adapter_rank")
        check_int(self, "kv_heads", "head_dim", "max_positions", optional=True)
        check_int(self, "shared_expert_ffn_hidden", minimum=0)
        check_bool(self, "rope", "tie_embeddings", "causal_flops", "shared_mlp_adapter", "shared_attn_adapter")
        check_choice(self, "shared_act", GLU_KINDS)
        check_choice(self, "mlp_act", MLP_ACTS)
        check_choice(self, "router_score", ROUTER_SCORES)
        check_choice(self, "attention", ATTENTION_KINDS)
        check_choice(self, "dtype", DTYPES)
        check_divides(self, "ssm_groups", "ssm_heads", f"each group of B and C serves whole heads; valid "
                                                       f"ssm_groups divide {self.ssm_heads}")
        if self.ssm_version not in SSM_VERSIONS or isinstance(self.ssm_version, bool):
            raise UsageError(f"HybridConfig ssm_version={self.ssm_version!r}: valid values are 1 (Mamba-1) and 2 "
                             f"(Mamba-2)")
        check_bool(self, "ssm_dt_norm", "ssm_proj_bias", "conv_bias")
        check_int(self, "blocks_per_layer")
        if len(self.pattern) % self.blocks_per_layer:
            raise UsageError(f"HybridConfig pattern={self.pattern!r}: {len(self.pattern)} blocks do not make whole "
                             f"layers of blocks_per_layer={self.blocks_per_layer}")
        if self.ssm_version == 1 and "M" in self.pattern:
            check_int(self, "ssm_channels", "dt_rank", why="a Mamba-1 layer needs it")
        if "*" in self.pattern or "H" in self.pattern:
            if self.head_dim is None:
                check_divides(self, "heads", "hidden", f"without head_dim the head dim is hidden/heads; use a "
                                                       f"head count that divides {self.hidden} or set head_dim")
            check_divides(self, "kv_heads", "heads", f"valid kv_heads divide {self.heads}")
        if "H" in self.pattern and self.shared_attn_adapter and self.groups != self.heads:
            raise UsageError(f"HybridConfig kv_heads={self.kv_heads}: the shared attention's adapters write "
                             f"k and v as wide as q (Zamba2); valid kv_heads: {self.heads} (or no adapters)")
        if "E" in self.pattern:
            check_at_most(self, "experts_per_token", "experts", f"valid values are 1..{self.experts}")
        if self.max_positions is not None:
            check_at_most(self, "seq_len", "max_positions", f"the model's context is {self.max_positions} tokens")

    #: ``--set`` names of the layer count: the first N layers of the pattern
    LAYER_KEYS = ("layers", "num_hidden_layers", "num_layers", "n_layer")

    def with_overrides(self, overrides):
        """``--set``, where a layer count keeps the first N layers of the pattern (a config
        read from a config.json is read again with its own key, see ModelConfig)."""
        overrides = dict(overrides)
        count = next((k for k in self.LAYER_KEYS if k in overrides), None)
        from_file = count is not None and count != "layers" and hasattr(self, "_hf_source")
        if count is None or from_file:
            return super().with_overrides(overrides)
        raw = overrides.pop(count)
        try:
            n = int(raw)
        except ValueError:
            raise UsageError(f"--set {count}={raw}: expected an integer") from None
        if not 1 <= n <= self.layers:
            raise UsageError(f"--set {count}={raw}: {self.name} has {self.layers} layers; valid values are "
                             f"1..{self.layers}")
        cut = self.replace(pattern=self.pattern[:n * self.blocks_per_layer])
        return cut.with_overrides(overrides) if overrides else cut

    # ------------------------------------------------------------------ derived values
    @property
    def layers(self) -> int:
        return len(self.pattern) // self.blocks_per_layer

    def layer_indices(self, kind: str) -> tuple[int, ...]:
        """The blocks of ``kind`` (``mamba``, ``attention``, ``mlp``, ``moe``, ``hybrid``)."""
        return tuple(i for i, ch in enumerate(self.pattern) if LAYER_KINDS[ch] == kind)

    @property
    def mixer_indices(self) -> tuple[int, ...]:
        """The blocks that hold a Mamba mixer: ``M`` and Zamba2's ``H``."""
        return tuple(i for i, ch in enumerate(self.pattern) if LAYER_KINDS[ch] in MIXER_KINDS)

    @property
    def shared_uses(self) -> int:
        """How many times the shared transformer blocks run (Zamba2's ``H`` layers)."""
        return self.pattern.count("H")

    @property
    def groups(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def padded_vocab(self) -> int:
        return padded(self.vocab_size, self.vocab_pad_to)

    @property
    def ssm_inner(self) -> int:
        """d_inner = heads · head dim (Mamba-1: its channels)."""
        return self.ssm_channels if self.ssm_version == 1 else self.ssm_heads * self.ssm_head_dim

    @property
    def ssm_state_elements(self) -> int:
        """A Mamba layer's recurrent state per sequence: d_inner · state size."""
        return self.ssm_inner * self.ssm_state

    @property
    def conv_state_elements(self) -> int:
        """A Mamba layer's conv state per sequence: the last taps − 1 inputs of every channel
        (Mamba-2 convolves B and C too)."""
        extra = 0 if self.ssm_version == 1 else 2 * self.ssm_groups * self.ssm_state
        return (self.conv_kernel - 1) * (self.ssm_inner + extra)

    def dims(self) -> dict[str, int]:
        """Numeric values of the model's dims (every dim but the plan's ``b`` and ``s``).

        h, V; Mamba-2 (with ``M`` layers): mg groups, mh heads, mp head dim, mn state size,
        mk conv taps; Mamba-1: mg channels (d_inner), mn state size, mk conv taps, mr Δ rank;
        attention: a, g, d; MLP: f; MoE: E, k, fe (and fs with a shared expert); Zamba2's
        shared blocks (``H``): a, g, d, f and the adapters' rank lr.
        """
        kinds = {LAYER_KINDS[ch] for ch in self.pattern}
        if "hybrid" in kinds:  # a shared transformer block and a Mamba mixer
            kinds |= {"mamba", "attention", "mlp"}
            if self.shared_mlp_adapter or self.shared_attn_adapter:
                kinds.add("adapter")
        out = {"h": self.hidden, "V": self.padded_vocab}
        if "mamba" in kinds and self.ssm_version == 1:  # mg: the d_inner channels (tensor parallel splits them)
            out.update(mg=self.ssm_channels, mn=self.ssm_state, mk=self.conv_kernel, mr=self.dt_rank)
        elif "mamba" in kinds:
            out.update(mg=self.ssm_groups, mh=self.ssm_heads, mp=self.ssm_head_dim, mn=self.ssm_state,
                       mk=self.conv_kernel)
        if "attention" in kinds:
            out.update(a=self.heads, g=self.groups, d=self.head_size)
        if "mlp" in kinds:
            out["f"] = self.ffn_hidden
        if "adapter" in kinds:
            out["lr"] = self.adapter_rank
        if "moe" in kinds:
            out.update(E=self.experts, k=self.experts_per_token, fe=self.expert_ffn_hidden)
            if self.shared_expert_ffn_hidden:
                out["fs"] = self.shared_expert_ffn_hidden
        return out

    def to_hf(self) -> dict:
        """This config as a Hugging Face ``config.json`` dict (``model_type`` = ``family``)."""
        from .hf import to_hf

        return to_hf(self)
