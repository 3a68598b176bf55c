"""BERT (Devlin et al. 2019) as Hugging Face's BertForPreTraining computes it: one device,
forward only, over the plan's ``b`` sequences of ``s`` tokens.

* embeddings: word [V, h] and learned positions [P, h] (one lookup kernel), token types
  [T, h] (a second lookup, added), LayerNorm, dropout -> the residual stream;
* each layer (``layers.<i>.``), post-LayerNorm: multi-head attention over every token
  (bidirectional: no causal discount, no KV cache; the blocks' fused QKV layout with
  bias) -> bias-dropout-add -> ``attn.norm``; GeLU MLP -> bias-dropout-add -> ``mlp.norm``;
* the masked-LM head: ``mlm.transform`` [h, h] + bias, GeLU, ``mlm.norm``, the decoder tied
  to the word embeddings with its own bias [V] -> a cross-entropy over every position
  (``mlm_labels`` [b, s]);
* next-sentence prediction: the first token ([CLS]) -> ``pooler`` [h, h] + bias, tanh ->
  ``nsp`` [2, h] + bias -> a cross-entropy against ``nsp_labels`` [b];
* the loss per sequence: its masked-LM losses summed over the tokens, plus its next-sentence loss.

Tensor parallel shards what STAGE's conventions name (heads ``g``, FFN ``f``, vocabulary
``V``: the tied decoder and its cross-entropy are vocabulary parallel); the pooler, the NSP
head and the MLM transform are small and run whole on every tp rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from stage_core.api import (ATTENTION_KINDS, DTYPES, OTHER, RESIDUAL, STANDARD_KERNELS, Graph, KernelDef, KernelSpec,
                            ModelConfig, UsageError, blocks, check_at_most, check_choice, check_int, check_str, padded,
                            sym)

FAMILY = "bert"


@dataclass(frozen=True)
class BertConfig(ModelConfig):
    """A BERT encoder with its pre-training heads; ``seq_len`` is the default sequence length
    (the plan's ``--seq-len`` changes it, up to ``max_positions``)."""

    name: str = "bert-base"
    family: str = FAMILY
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    ffn_hidden: int = 3072
    vocab_size: int = 30522
    vocab_pad_to: int = 1
    type_vocab: int = 2
    max_positions: int = 512
    seq_len: int = 512
    attention: str = "flash"
    dtype: str = "bf16"

    def __post_init__(self):
        check_str(self, "name")
        if self.family != FAMILY:
            raise UsageError(f"BertConfig family={self.family!r}: a BERT config's family must be {FAMILY!r}")
        check_int(self, "layers", "hidden", "heads", "ffn_hidden", "vocab_size", "vocab_pad_to", "type_vocab",
                  "max_positions", "seq_len")
        if self.hidden % self.heads:
            raise UsageError(f"BertConfig heads={self.heads} does not divide hidden={self.hidden}: the head dim is "
                             f"hidden/heads")
        check_at_most(self, "seq_len", "max_positions", f"learned positions exist for {self.max_positions} tokens")
        check_choice(self, "attention", ATTENTION_KINDS)
        check_choice(self, "dtype", DTYPES)

    @property
    def padded_vocab(self) -> int:
        return padded(self.vocab_size, self.vocab_pad_to)

    def dims(self) -> dict[str, int]:
        return {"h": self.hidden, "a": self.heads, "g": self.heads, "d": self.hidden // self.heads,
                "f": self.ffn_hidden, "V": self.padded_vocab, "P": self.max_positions, "T": self.type_vocab}


def _tanh(call) -> KernelDef:
    """tanh, elementwise: (e^2x - 1)/(e^2x + 1), 4 FLOPs an element."""
    (x,) = call.inputs
    t = "abcdefgh"[: x.rank]
    return KernelDef(spec=f"{t}->{t}", flops=[(4, t, OTHER)])


def _tanh_backward(grads) -> list[KernelDef]:
    """dy·(1 - y²): 3 FLOPs an element, from the output."""
    t = "abcdefgh"[: grads.inputs[0].rank]
    return [KernelDef(spec=f"{t},{t}->{t}", reads=("dy", "y0"), grads=(0,), flops=[(3, t, OTHER)])]


TANH = KernelSpec("tanh", _tanh, _tanh_backward, "elementwise", "tanh (BERT's pooler)")


def _dense(g, x, name: str, out, *, spec: str):
    """A linear layer with its bias in the same kernel (Hugging Face's nn.Linear)."""
    w = g.param(f"{name}.weight", (x.shape[-1], out))
    return g.einsum(spec, x, w, bias=g.param(f"{name}.bias", (out,)), name=name)


def build_bert(c: BertConfig) -> Graph:
    g = blocks.model_builder(c, max_positions=c.max_positions, attention=c.attention)
    h, T = sym.dims("h T")
    x, mlm_labels, wte = blocks.embed(g, positions=True, tags=())  # word + positions in one lookup
    types = g.input("token_types", ("b", "s"))
    x = g.add(x, g.embedding(types, g.param("embed.token_type", (T, h)), name="embed.types"), name="embed.add")
    x = g.dropout(blocks.norm(g, x, "embed.norm", "layernorm", bias=True), name="embed.dropout", tags=RESIDUAL)
    for i in range(c.layers):
        with g.layer(i):
            out = blocks.gqa_attention(g, x, kind=c.attention, dropout=True, qkv_bias=True, cache=False)
            x = g.dropout_add(out, x, g.param("attn.proj.bias", (h,)), name="attn.residual")
            x = blocks.norm(g, x, "attn.norm", "layernorm", bias=True, tags=RESIDUAL)
            z = blocks.gelu_mlp(g, x)
            x = g.dropout_add(z, x, g.param("mlp.fc2.bias", (h,)), name="mlp.residual")
            x = blocks.norm(g, x, "mlp.norm", "layernorm", bias=True, tags=RESIDUAL)
    # masked LM: transform, GeLU, LayerNorm, the decoder tied to the word embeddings (its own bias)
    y = g.gelu(_dense(g, x, "mlm.transform", h, spec="bsh,hk->bsk"), name="mlm.gelu")
    y = blocks.norm(g, y, "mlm.norm", "layernorm", bias=True)
    logits = g.einsum("bsh,vh->bsv", y, wte, bias=g.param("mlm.decoder.bias", ("V",)), name="mlm.decoder")
    mlm = g.kernel("sum", g.cross_entropy(logits, mlm_labels, name="mlm.loss"), name="mlm.loss_sum", spec="bs->b")
    # next-sentence prediction from the [CLS] token
    first = g.kernel("first_token", x, name="pooler.first_token")
    pooled = g.kernel("tanh", _dense(g, first, "pooler", h, spec="bh,hk->bk"), name="pooler.tanh")
    nsp_labels = g.input("nsp_labels", ("b",))
    nsp_logits = _dense(g, pooled, "nsp", 2, spec="bh,hk->bk")
    nsp = g.cross_entropy(nsp_logits, nsp_labels, name="nsp.loss")
    return g.finish(g.add(mlm, nsp, name="loss"))  # per sequence: its masked-LM and next-sentence losses


KERNELS = (STANDARD_KERNELS["sum"], STANDARD_KERNELS["first_token"], TANH)
