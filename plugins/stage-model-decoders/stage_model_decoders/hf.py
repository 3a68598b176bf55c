"""Hugging Face ``config.json`` (model_type gemma2, gemma3, gemma3_text, phi3, olmo2) to and from :class:`DecoderConfig`.

Keys read by every family: ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads`` (absent or null: as many as the heads),
``head_dim`` (absent or null: hidden_size / num_attention_heads), ``vocab_size``,
``max_position_embeddings``, ``tie_word_embeddings`` (default: true for Gemma, false
otherwise), ``attention_bias`` (must be false), and the activation key
(``hidden_activation`` or ``hidden_act``).  Per family:

* gemma2: ``sliding_window``, ``attn_logit_softcapping``, ``final_logit_softcapping``;
  local layers alternate with global ones (``layer_types`` when given, else every
  other layer, the first local).
* gemma3 (its text decoder, under ``text_config``) and gemma3_text: ``sliding_window``,
  ``sliding_window_pattern`` (default 6: every sixth layer global) or ``layer_types``,
  the soft-caps when set; per-head q/k norms.  Keys left out take transformers'
  ``Gemma3TextConfig`` defaults (vocab_size 262208, max_position_embeddings 131072,
  sliding_window 4096), as the published multimodal configs rely on.
* phi3: ``sliding_window`` (null: full attention; else every layer is local).
* olmo2: norms after each block, q/k norms over all heads.

Keys that change nothing STAGE counts (norm epsilons, rope bases and scaling,
initializers, token ids, dropout probabilities...) are accepted.  STAGE's own settings
(name, vocabulary padding, training sequence length, attention kernel, dtype) travel in
an optional ``"stage"`` object that :func:`to_hf` writes, so configs round-trip.  Without
it the training sequence length is ``min(max_position_embeddings, 8192)``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from stage_core.api import HFKeys, HFReader, UsageError, load_hf_config

from .config import DecoderConfig

MODEL_TYPES = ("gemma2", "gemma3", "gemma3_text", "phi3", "olmo2")
ARCHITECTURES = {"gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM",
                 "olmo2": "Olmo2ForCausalLM"}
DEFAULT_SEQ_CAP = 8192
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new")
SILU = ("silu", "swish")
LAYER_TYPES = ("sliding_attention", "full_attention")

#: what each family fixes, and its activation
FAMILY_FIELDS = {
    "gemma2": dict(norm_placement="sandwich", mlp_act="geglu", embed_scale=True, qk_norm="none"),
    "gemma3": dict(norm_placement="sandwich", mlp_act="geglu", embed_scale=True, qk_norm="head"),
    "phi3": dict(norm_placement="pre", mlp_act="swiglu", embed_scale=False, qk_norm="none"),
    "olmo2": dict(norm_placement="post", mlp_act="swiglu", embed_scale=False, qk_norm="all"),
}
ACTIVATIONS = {"geglu": GELU_TANH, "swiglu": SILU}
#: the config.json key behind each field a config check may name
FIELD_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
              "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn_hidden": "intermediate_size",
              "vocab_size": "vocab_size", "max_positions": "max_position_embeddings",
              "sliding_window": "sliding_window", "attn_softcap": "attn_logit_softcapping",
              "final_softcap": "final_logit_softcapping", "tie_embeddings": "tie_word_embeddings"}
#: transformers' Gemma3TextConfig defaults, which published gemma3 text_config objects leave out
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262_208, "max_position_embeddings": 131_072, "sliding_window": 4096}


def config_from_hf(source: Mapping[str, Any] | str | os.PathLike) -> DecoderConfig | None:
    """A :class:`DecoderConfig` from a gemma2/gemma3/gemma3_text/phi3/olmo2 config.json; else ``None``
    (the host reads any model_type by its keys; this function reads these model_types)."""
    data, label = load_hf_config(source)
    family = _family_of(data.get("model_type"))
    if family is None:
        return None
    return read(HFKeys(data, label), family)


def _family_of(model_type) -> str | None:
    if not isinstance(model_type, str):
        return None
    family = "gemma3" if model_type.startswith("gemma3") else model_type
    return family if family in FAMILY_FIELDS else None


def read(top: HFKeys, family: str) -> DecoderConfig:
    """A :class:`DecoderConfig` of ``family`` from a config.json's keys (its decoder under
    ``text_config`` when it has one)."""
    nested = top.model_type == "gemma3" or (isinstance(top.data.get("text_config"), Mapping)
                                            and "hidden_size" not in top.data)
    r = top.child("text_config") if nested else top  # the multimodal config's decoder

    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    layers = r.int("num_hidden_layers")
    kv_heads = r.int("num_key_value_heads", default=None) or heads
    head_dim = r.int("head_dim", default=None)
    if head_dim is None and hidden % heads:
        r.fail("num_attention_heads", f"does not divide hidden_size={hidden} and there is no head_dim "
                                      f"(valid head counts divide {hidden})")
    if heads % kv_heads:
        r.fail("num_key_value_heads", f"does not divide num_attention_heads={heads} (valid values divide {heads})")
    fixed = FAMILY_FIELDS[family]
    act_key = "hidden_activation" if r.get("hidden_activation") is not None else "hidden_act"
    valid = ACTIVATIONS[fixed["mlp_act"]]
    if r.get(act_key, valid[0]) not in valid:
        r.fail(act_key, f"this family's MLP is {fixed['mlp_act']}; valid: {', '.join(valid)}")
    if r.bool("attention_bias", False):
        r.fail("attention_bias", "biased attention projections are not modelled; valid: false")
    defaults = GEMMA3_TEXT_DEFAULTS if family == "gemma3" else {}
    positions = r.int("max_position_embeddings", **_default(defaults, "max_position_embeddings"))
    fields: dict[str, Any] = dict(
        fixed,
        name=top.model_name,
        family=family,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden=r.int("intermediate_size"),
        vocab_size=r.int("vocab_size", **_default(defaults, "vocab_size")),
        max_positions=positions,
        seq_len=min(positions, DEFAULT_SEQ_CAP),
        tie_embeddings=top.bool("tie_word_embeddings", r.bool("tie_word_embeddings", family.startswith("gemma"))),
        sliding_window=r.int("sliding_window", default=defaults.get("sliding_window")),
        attn_softcap=r.number("attn_logit_softcapping", None),
        final_softcap=r.number("final_logit_softcapping", None),
    )
    default_every = {"gemma2": 2, "gemma3": r.int("sliding_window_pattern", default=6), "phi3": 0, "olmo2": 0}
    fields["global_every"] = _global_every(r, layers, default_every[family])
    if fields["global_every"] is None:  # every layer global
        fields.update(sliding_window=None, global_every=0)
    elif fields["sliding_window"] is None and r.get("layer_types") is not None:
        r.fail("layer_types", "names sliding_attention layers but there is no sliding_window")
    if family == "olmo2" and fields["sliding_window"] is not None:
        r.fail("sliding_window", "OLMo 2 has no local attention; valid: null")
    return top.make(DecoderConfig, fields, keys=FIELD_KEYS)


#: keys every family of this plugin reads, and each family's own (the evidence for it)
COMMON_KEYS = ("vocab_size", "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings",
               "tie_word_embeddings", "hidden_act", "hidden_activation", "attention_bias", "sliding_window",
               "layer_types")
OWN_KEYS = {"gemma2": ("attn_logit_softcapping", "final_logit_softcapping"),
            "gemma3": ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window_pattern"),
            "phi3": (), "olmo2": ()}
HF_TYPES = {"gemma2": ("gemma2",), "gemma3": ("gemma3", "gemma3_text"), "phi3": ("phi3",), "olmo2": ("olmo2",)}


def _reader(family: str) -> HFReader:
    return HFReader(read=lambda r: read(r, family),
                    requires=(("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",),
                              ("intermediate_size",)),
                    reads=COMMON_KEYS + OWN_KEYS[family], model_types=HF_TYPES[family])


READERS = {family: _reader(family) for family in FAMILY_FIELDS}


def _default(defaults: Mapping[str, Any], key: str) -> dict:
    return {"default": defaults[key]} if key in defaults else {}


def _global_every(r: HFKeys, layers: int, default: int) -> int | None:
    """The period of the global layers, from ``layer_types`` when given (``None``: all global)."""
    return r.global_every("layer_types", layers, default)


def to_hf(config: DecoderConfig) -> dict[str, Any]:
    """``config`` as a config.json dict of its family; ``config_from_hf(to_hf(c)) == c`` for configs
    whose layer options match the family's (as every preset does)."""
    c = config
    fixed = FAMILY_FIELDS[c.family]
    differs = [key for key, value in fixed.items() if getattr(c, key) != value]
    if not c.family.startswith("gemma"):
        differs += [key for key in ("attn_softcap", "final_softcap") if getattr(c, key) is not None]
    if c.family == "olmo2" and c.sliding_window is not None:
        differs.append("sliding_window")
    if differs:
        key = differs[0]
        raise UsageError(f"DecoderConfig {key}={getattr(c, key)!r}: model_type {c.family!r} has "
                         f"{key}={fixed.get(key)!r}; its config.json cannot say otherwise")
    out: dict[str, Any] = {
        "model_type": "gemma3_text" if c.family == "gemma3" else c.family,
        "architectures": [ARCHITECTURES[c.family]],
        "hidden_size": c.hidden,
        "intermediate_size": c.ffn_hidden,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.groups,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_positions,
        "tie_word_embeddings": c.tie_embeddings,
        "attention_bias": False,
        "hidden_activation" if c.family.startswith("gemma") else "hidden_act": ACTIVATIONS[c.mlp_act][0],
        "sliding_window": c.sliding_window,
    }
    if c.head_dim is not None:
        out["head_dim"] = c.head_dim
    if c.family.startswith("gemma"):
        out["attn_logit_softcapping"] = c.attn_softcap
        out["final_logit_softcapping"] = c.final_softcap
    if c.sliding_window is not None:
        out["layer_types"] = [LAYER_TYPES[0] if c.is_local(i) else LAYER_TYPES[1] for i in range(c.layers)]
    out["stage"] = c.stage_block()
    return out
