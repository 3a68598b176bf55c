"""DecoderConfig: one config for the decoder families of this plugin (Gemma 2, Gemma 3, Phi-3, OLMo 2).

They share grouped-query attention with rotary positions and a gated MLP, and differ in
where the norms sit, which attention layers are local, soft-capping, q/k norms, the MLP's
activation and the embedding scale.  Each difference is a plain field, so any combination
builds; ``family`` names the Hugging Face ``model_type`` the config mirrors (it decides
the key names of :meth:`DecoderConfig.to_hf` and which ``stage models`` family lists it).
Derived values (query groups, head size, which layers are local) are properties, so a
``--set`` override never leaves a stale derived value behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from stage_core.api import (ATTENTION_KINDS, DTYPES, GLU_KINDS, ModelConfig, check_at_most, check_bool, check_choice,
                            check_divides, check_int, check_positive_number, check_str, padded)

FAMILIES = ("gemma2", "gemma3", "phi3", "olmo2")
#: pre: norm -> block -> add (Llama, Phi-3); sandwich: norm -> block -> norm -> add (Gemma 2/3);
#: post: block -> norm -> add (OLMo 2)
NORM_PLACEMENTS = ("pre", "sandwich", "post")
#: q/k RMSNorm: none, per head over d (Gemma 3), over all heads together (OLMo 2)
QK_NORMS = ("none", "head", "all")


@dataclass(frozen=True)
class DecoderConfig(ModelConfig):
    """A decoder of RMSNorm, GQA with RoPE and a gated MLP, and the options its families need.

    ``kv_heads`` (``None``: multi-head attention) must divide ``heads``; ``head_dim``
    (``None``: hidden/heads) may make a·d differ from h (Gemma).  ``sliding_window``
    (``None``: every layer attends to the whole sequence) makes layers local, each
    query reading only the last ``sliding_window`` keys; with ``global_every`` = n > 0,
    layer i stays global when (i + 1) is a multiple of n (Gemma 2: n = 2, Gemma 3:
    n = 6), with 0 every layer is local (Phi-3, Mistral).  ``attn_softcap`` and
    ``final_softcap`` soft-cap the attention scores and the final logits (Gemma 2).
    ``embed_scale`` multiplies the embeddings by sqrt(hidden) (Gemma).  The vocabulary
    is padded to a multiple of ``vocab_pad_to`` (1: as the checkpoint stores it).
    """

    name: str = "decoder-tiny"
    family: str = "gemma2"
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int | None = 2
    head_dim: int | None = None
    ffn_hidden: int = 256
    vocab_size: int = 512
    vocab_pad_to: int = 1
    max_positions: int = 256
    seq_len: int = 256
    norm_placement: str = "pre"
    mlp_act: str = "swiglu"
    qk_norm: str = "none"
    sliding_window: int | None = None
    global_every: int = 0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    embed_scale: bool = False
    tie_embeddings: bool = False
    attention: str = "flash"
    causal_flops: bool = False
    dtype: str = "bf16"

    def __post_init__(self):
        check_str(self, "name")
        check_choice(self, "family", FAMILIES)
        check_int(self, "layers", "hidden", "heads", "ffn_hidden", "vocab_size", "vocab_pad_to", "max_positions",
                  "seq_len")
        check_int(self, "kv_heads", "head_dim", "sliding_window", optional=True)
        check_int(self, "global_every", minimum=0)
        check_positive_number(self, "attn_softcap", "final_softcap", optional=True)
        check_bool(self, "embed_scale", "tie_embeddings", "causal_flops")
        check_choice(self, "norm_placement", NORM_PLACEMENTS)
        check_choice(self, "mlp_act", GLU_KINDS)
        check_choice(self, "qk_norm", QK_NORMS)
        check_choice(self, "attention", ATTENTION_KINDS)
        check_choice(self, "dtype", DTYPES)
        if self.head_dim is None:
            check_divides(self, "heads", "hidden", f"without head_dim the head dim is hidden/heads; use a head "
                                                   f"count that divides {self.hidden} or set head_dim")
        check_divides(self, "kv_heads", "heads", f"each key/value head serves a whole group of query heads; "
                                                 f"valid kv_heads divide {self.heads}")
        check_at_most(self, "seq_len", "max_positions", f"the model's context is {self.max_positions} tokens")

    # ------------------------------------------------------------------ derived values
    @property
    def groups(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def padded_vocab(self) -> int:
        return padded(self.vocab_size, self.vocab_pad_to)

    def is_local(self, i: int) -> bool:
        """Whether layer ``i`` attends through the sliding window."""
        return self.sliding_window is not None and (self.global_every == 0 or (i + 1) % self.global_every != 0)

    @property
    def local_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.layers) if self.is_local(i))

    def dims(self) -> dict[str, int]:
        """Numeric values of the model's dims (every dim but the plan's ``b`` and ``s``)."""
        return {"h": self.hidden, "a": self.heads, "g": self.groups, "d": self.head_size, "f": self.ffn_hidden,
                "V": self.padded_vocab}

    def to_hf(self) -> dict:
        """This config as a Hugging Face ``config.json`` dict (``model_type`` = ``family``)."""
        from .hf import to_hf

        return to_hf(self)
