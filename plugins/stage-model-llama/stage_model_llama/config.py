"""LlamaConfig: the LLaMA family's configuration (Llama 2/3, Mistral, Qwen2/2.5).

Pre-RMSNorm decoder layers of grouped-query attention with rotary positions and a
SwiGLU MLP.  Fields are plain values; derived sizes (query groups, head dim, padded
vocabulary) are properties, so an override never leaves a stale derived value.
"""

from __future__ import annotations

from dataclasses import dataclass

from stage_core.errors import UsageError
from stage_core.models import ModelConfig

FAMILY = "llama"
ATTENTION_KINDS = ("flash", "classic")
DTYPES = ("bf16", "fp16", "fp32")


def padded(size: int, multiple: int) -> int:
    """``size`` rounded up to a multiple of ``multiple`` (Megatron's vocabulary padding)."""
    return -(-size // multiple) * multiple


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
    ``causal_flops`` halves the attention-score FLOPs.
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
    attention: str = "flash"
    causal_flops: bool = False
    dtype: str = "bf16"

    def __post_init__(self):
        cls = type(self).__name__
        if not isinstance(self.name, str):
            raise UsageError(f"{cls} name={self.name!r}: expected a string")
        if self.family != FAMILY:
            raise UsageError(f"{cls} family={self.family!r}: a LLaMA config's family must be {FAMILY!r}")
        for field in ("layers", "hidden", "heads", "ffn_hidden", "vocab_size", "vocab_pad_to", "max_positions",
                      "seq_len"):
            _check_positive_int(self, field)
        for field in ("kv_heads", "head_dim"):
            if getattr(self, field) is not None:
                _check_positive_int(self, field)
        for field in ("tie_embeddings", "qkv_bias", "causal_flops"):
            value = getattr(self, field)
            if not isinstance(value, bool):
                raise UsageError(f"{cls} {field}={value!r}: expected true or false")
        if self.head_dim is None and self.hidden % self.heads:
            raise UsageError(
                f"{cls} heads={self.heads} does not divide hidden={self.hidden}: without head_dim the head dim "
                f"is hidden/heads; use a head count that divides {self.hidden} or set head_dim"
            )
        if self.heads % self.groups:
            raise UsageError(
                f"{cls} kv_heads={self.kv_heads} does not divide heads={self.heads}: each key/value head "
                f"serves a whole group of query heads; valid kv_heads divide {self.heads}"
            )
        if self.attention not in ATTENTION_KINDS:
            raise UsageError(f"{cls} attention={self.attention!r}: valid values are {', '.join(ATTENTION_KINDS)}")
        if self.dtype not in DTYPES:
            raise UsageError(f"{cls} dtype={self.dtype!r}: valid values are {', '.join(DTYPES)}")
        if self.seq_len > self.max_positions:
            raise UsageError(
                f"{cls} seq_len={self.seq_len} exceeds max_positions={self.max_positions}: "
                f"the model's context is {self.max_positions} tokens"
            )

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


def _check_positive_int(cfg, field: str) -> None:
    value = getattr(cfg, field)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{type(cfg).__name__} {field}={value!r}: expected a positive integer")
