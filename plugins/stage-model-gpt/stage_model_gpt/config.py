"""GPTConfig: the GPT family's configuration (Megatron-LM's GPT: pre-LayerNorm, learned positions).

Fields are plain values; derived sizes (head dim, FFN width, padded vocabulary) are
properties, so ``--set hidden=...`` never leaves a stale derived value behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from stage_core.api import (ATTENTION_KINDS, DTYPES, ModelConfig, UsageError, check_at_most, check_bool, check_choice,
                            check_divides, check_int, check_str, padded)

FAMILY = "gpt"


@dataclass(frozen=True)
class GPTConfig(ModelConfig):
    """A GPT model: ``layers`` pre-LN transformer layers of multi-head attention and a GeLU MLP.

    ``vocab_size`` is the tokenizer's vocabulary; the embedding table has
    ``padded_vocab`` rows (rounded up to ``vocab_pad_to``, as Megatron-LM pads).
    ``max_positions`` rows of learned position embeddings exist; ``seq_len`` is the
    training sequence length used when the plan gives none.
    ``attention``: ``"flash"`` (fused, no s×s tensor kept) or ``"classic"`` (scores,
    softmax, dropout and context as separate kernels). ``causal_flops`` halves the
    attention-score FLOPs (the published Megatron formula counts the full s×s).
    """

    name: str = "gpt"
    family: str = FAMILY
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    ffn_hidden: int | None = None  # None: 4 * hidden
    vocab_size: int = 512
    vocab_pad_to: int = 128
    max_positions: int = 256
    seq_len: int = 256
    tie_embeddings: bool = True
    attention: str = "flash"
    causal_flops: bool = False
    dtype: str = "bf16"

    def __post_init__(self):
        check_str(self, "name")
        if self.family != FAMILY:
            raise UsageError(f"GPTConfig family={self.family!r}: a GPT config's family must be {FAMILY!r}")
        check_int(self, "layers", "hidden", "heads", "vocab_size", "vocab_pad_to", "max_positions", "seq_len")
        check_int(self, "ffn_hidden", optional=True)
        check_bool(self, "tie_embeddings", "causal_flops")
        check_divides(self, "heads", "hidden",
                      f"the head dim is hidden/heads; valid head counts divide {self.hidden}")
        check_choice(self, "attention", ATTENTION_KINDS)
        check_choice(self, "dtype", DTYPES)
        check_at_most(self, "seq_len", "max_positions",
                      f"learned positions exist for at most {self.max_positions} tokens")

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def padded_vocab(self) -> int:
        return padded(self.vocab_size, self.vocab_pad_to)

    def dims(self) -> dict[str, int]:
        """Numeric values of the model's dims (every dim but the plan's ``b`` and ``s``)."""
        return {
            "h": self.hidden,
            "a": self.heads,
            "g": self.heads,  # multi-head attention: one query group per head
            "d": self.head_dim,
            "f": self.ffn,
            "V": self.padded_vocab,
            "P": self.max_positions,
        }

    def to_hf(self) -> dict:
        """This config as a Hugging Face ``config.json`` dict (``model_type`` gpt2)."""
        from .hf import to_hf

        return to_hf(self)

