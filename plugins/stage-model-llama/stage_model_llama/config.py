"""LlamaConfig: the Llama-shaped decoders' configuration (Llama 2/3, Mistral, Qwen2/2.5/3,
Granite, InternLM2, MiniCPM, GLM/ChatGLM, StarCoder2, Cohere, Falcon).

Pre-norm decoder layers of grouped-query attention and an MLP.  The differences between
those models are plain fields: the norm (RMSNorm or LayerNorm, with or without bias),
biases, q/k norms, the MLP's activation (gated or not), parallel attention and MLP
blocks, positions (RoPE or ALiBi) and an embedding multiplier.  Derived sizes (query
groups, head dim, padded vocabulary) are properties, so an override never leaves a stale
derived value.
"""

from __future__ import annotations

from dataclasses import dataclass

from stage_core.api import (ATTENTION_KINDS, DTYPES, ModelConfig, UsageError, check_at_most, check_bool, check_choice,
                            check_divides, check_int, check_positive_number, check_str, padded)

FAMILY = "llama"
NORMS = ("rmsnorm", "layernorm")
#: the MLP: SwiGLU or GeGLU (gate, up, down), or GeLU (up, GeLU, down; no gate)
MLP_ACTS = ("swiglu", "geglu", "gelu")
QK_NORMS = ("none", "head")
POSITIONS = ("rope", "alibi", "none")


@dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """A LLaMA-style model.

    ``kv_heads`` (query groups; ``None``: as many as ``heads``, i.e. multi-head
    attention) must divide ``heads``.  ``head_dim`` (``None``: hidden/heads) may differ
    from hidden/heads, as in some Mistral models.  ``qkv_bias`` adds biases to the
    query, key and value projections only (Qwen2).  ``vocab_size`` is padded up to a
    multiple of ``vocab_pad_to`` for the embedding table.  ``max_positions`` is the
    context the rotary embedding was built for; ``seq_len`` the training sequence
    length used when the plan gives none.  ``attention``: ``"flash"`` or ``"classic"``;
    ``causal_flops`` halves the attention-score FLOPs.  ``sliding_window`` (Mistral 7B
    v0.1: 4096) makes every layer's attention local: each query reads only the last
    ``sliding_window`` keys, and the flash kernel counts only those.

    ``norm`` (``rmsnorm`` or ``layernorm``, with a bias when ``norm_bias``) is every norm
    of the model.  ``proj_bias`` biases the attention output projection, ``mlp_bias``
    every projection of the MLP.  ``qk_norm="head"``: an RMSNorm of each query and key
    head over its d values (Qwen3).  ``mlp_act``: ``swiglu``, ``geglu`` or ``gelu`` (two
    projections and a GeLU between them, StarCoder2 and Falcon).  ``parallel_block``:
    attention and MLP both read the layer's input, normed once (``parallel_norms`` 1:
    Cohere, Falcon 7B) or each by its own norm (2: Falcon 40B/180B), and their sum is
    added to the residual in one kernel.  ``position``: ``rope`` (rotary q and k),
    ``alibi`` or ``none`` (neither costs a parameter; ALiBi's bias is inside the
    attention kernel).  ``embed_multiplier`` scales the embeddings by a constant (MiniCPM,
    Granite): one ``embed.scale`` kernel.
    """

    name: str = "llama"
    family: str = FAMILY
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int | None = 2
    head_dim: int | None = None
    ffn_hidden: int = 352
    vocab_size: int = 512
    vocab_pad_to: int = 128
    max_positions: int = 256
    seq_len: int = 256
    tie_embeddings: bool = False
    qkv_bias: bool = False
    sliding_window: int | None = None
    norm: str = "rmsnorm"
    norm_bias: bool = False
    proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: str = "none"
    mlp_act: str = "swiglu"
    parallel_block: bool = False
    parallel_norms: int = 1
    position: str = "rope"
    embed_multiplier: float | None = None
    attention: str = "flash"
    causal_flops: bool = False
    dtype: str = "bf16"

    def __post_init__(self):
        check_str(self, "name")
        if self.family != FAMILY:
            raise UsageError(f"LlamaConfig family={self.family!r}: a LLaMA config's family must be {FAMILY!r}")
        check_int(self, "layers", "hidden", "heads", "ffn_hidden", "vocab_size", "vocab_pad_to", "max_positions",
                  "seq_len")
        check_int(self, "kv_heads", "head_dim", "sliding_window", optional=True)
        check_bool(self, "tie_embeddings", "qkv_bias", "causal_flops", "norm_bias", "proj_bias", "mlp_bias",
                   "parallel_block")
        check_choice(self, "norm", NORMS)
        check_choice(self, "qk_norm", QK_NORMS)
        check_choice(self, "mlp_act", MLP_ACTS)
        check_choice(self, "position", POSITIONS)
        check_positive_number(self, "embed_multiplier", optional=True)
        if self.parallel_norms not in (1, 2) or isinstance(self.parallel_norms, bool):
            raise UsageError(f"LlamaConfig parallel_norms={self.parallel_norms!r}: valid values are 1 (one norm "
                             f"for attention and MLP) and 2 (a norm each)")
        if self.parallel_norms == 2 and not self.parallel_block:
            raise UsageError("LlamaConfig parallel_norms=2: two norms in parallel need parallel_block=True")
        if self.head_dim is None:
            check_divides(self, "heads", "hidden", f"without head_dim the head dim is hidden/heads; use a head "
                                                   f"count that divides {self.hidden} or set head_dim")
        check_divides(self, "kv_heads", "heads", f"each key/value head serves a whole group of query heads; "
                                                 f"valid kv_heads divide {self.heads}")
        check_choice(self, "attention", ATTENTION_KINDS)
        check_choice(self, "dtype", DTYPES)
        check_at_most(self, "seq_len", "max_positions", f"the model's context is {self.max_positions} tokens")

    # ------------------------------------------------------------------ derived sizes
    @property
    def groups(self) -> int:
        """Query groups (key/value heads)."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def padded_vocab(self) -> int:
        return padded(self.vocab_size, self.vocab_pad_to)

    def dims(self) -> dict[str, int]:
        """Numeric values of the model's dims (every dim but the plan's ``b`` and ``s``)."""
        return {
            "h": self.hidden,
            "a": self.heads,
            "g": self.groups,
            "d": self.head_size,
            "f": self.ffn_hidden,
            "V": self.padded_vocab,
        }

    def to_hf(self, model_type: str | None = None) -> dict:
        """This config as a Hugging Face ``config.json`` dict (see :func:`stage_model_llama.hf.to_hf`)."""
        from .hf import to_hf

        return to_hf(self, model_type)

