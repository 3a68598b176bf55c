"""Hugging Face ``config.json`` to and from :class:`LlamaConfig`, read by its keys.

Any config.json of a Llama-shaped decoder reads: the host picks this family when a
config has the decoder's keys and none of another family's (experts, state-space
layers...), whatever its ``model_type``.  Keys, with the other names models give them:

* shape: ``hidden_size``; ``num_hidden_layers`` (``num_layers``); ``num_attention_heads``;
  ``num_key_value_heads`` (``num_kv_heads``, ``multi_query_group_num`` with
  ``multi_query_attention``, ``multi_query`` true: one; absent: as many as the heads);
  ``head_dim`` (``kv_channels``; absent: hidden_size / heads); ``intermediate_size``
  (``ffn_hidden_size``); ``vocab_size`` (``padded_vocab_size``);
  ``max_position_embeddings`` (``seq_length``); ``tie_word_embeddings``.
* biases: ``attention_bias`` (q, k, v and the output projection; GLM's: q, k, v only),
  ``mlp_bias``, ``bias`` (Falcon: every projection; InternLM2: q, k, v and output),
  ``use_bias`` (StarCoder2: every projection), ``add_qkv_bias`` and ``add_bias_linear``
  (ChatGLM), ``qkv_bias``.
* norms: ``rmsnorm``, ``norm_type``, or a LayerNorm epsilon key (``layer_norm_eps``,
  ``layer_norm_epsilon``, ``norm_epsilon``, ``layernorm_epsilon``) for LayerNorm;
  ``post_layer_norm`` (true only), ``apply_residual_connection_post_layernorm`` (false only).
* ``hidden_act`` (``activation``): SiLU gives SwiGLU, GeLU gives GeGLU, or the plain GeLU
  MLP for the model_types that have no gate (StarCoder2, Falcon).
* parallel blocks: ``parallel_attn``, ``use_parallel_residual``,
  ``new_decoder_architecture`` with ``num_ln_in_parallel_attn`` (Falcon); ``alibi``.
* local attention: ``sliding_window`` in every layer, unless ``use_sliding_window`` is
  false (Qwen2/Qwen3, whose window on the upper layers only is refused when true).
* multipliers: ``scale_emb`` (MiniCPM) and ``embedding_multiplier`` (Granite) scale the
  embeddings (one kernel); ``residual_multiplier``, ``attention_multiplier``,
  ``logits_scaling``, ``logit_scale``, ``scale_depth``, ``dim_model_base`` fold into
  kernels that run anyway and change no count.
* ``use_qk_norm`` (Cohere's per-head LayerNorm weights) false only.

What a config.json has no key for comes from its ``model_type`` (:data:`ARCH`): Qwen2's
q, k, v biases, Qwen3's q/k norms, Cohere's parallel block and bias-free LayerNorm,
Falcon's and StarCoder2's GeLU MLP, and defaults (Cohere and Falcon tie their
embeddings).  An unknown model_type is read as Llama reads it.

STAGE's own settings that config.json has no key for (vocabulary padding, training
sequence length, attention kernel, dtype) travel in an optional ``"stage"`` object,
which :func:`to_hf` writes so that a config round-trips exactly.  Without it the
vocabulary is as the checkpoint stores it (no padding) and the training sequence length
is ``min(max_position_embeddings, 8192)``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from stage_core.api import HFKeys, HFReader, UsageError, load_hf_config

from .config import LlamaConfig

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "granite", "internlm2", "minicpm", "glm", "chatglm",
               "starcoder2", "cohere", "falcon")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
EXPORT_TYPES = tuple(ARCHITECTURES)
#: training sequence length when config.json says nothing (Llama 3 pre-trained at 8192)
DEFAULT_SEQ_CAP = 8192
SILU = ("silu", "swish")
GELU = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_tanh")
LAYER_NORM_EPS = ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "layernorm_epsilon")
#: keys that scale a tensor some kernel computes anyway: read, and no count changes
FOLDED_MULTIPLIERS = ("residual_multiplier", "attention_multiplier", "logits_scaling", "logit_scale", "scale_depth",
                      "dim_model_base")

#: what each model_type implies that its config.json has no key for
ARCH: dict[str, dict[str, Any]] = {
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": "head"},
    "starcoder2": {"gated": False, "norm": "layernorm", "norm_bias": True, "tie": True},
    "cohere": {"parallel_block": True, "norm": "layernorm", "norm_bias": False, "tie": True},
    "falcon": {"gated": False, "norm": "layernorm", "norm_bias": True, "tie": True, "ffn_times_hidden": 4,
               "positions": 2048, "act": "gelu"},
    "glm": {"attention_bias": "qkv"},
    "internlm2": {"bias": "attention"},
    "minicpm": {"tie": True},
}


def read(r: HFKeys) -> LlamaConfig:
    """A :class:`LlamaConfig` from a config.json's keys (raises UsageError naming a key)."""
    arch = ARCH.get(r.model_type, {})
    hidden = r.int("hidden_size")
    layers = r.int("num_hidden_layers", or_keys=("num_layers",))
    heads = r.int("num_attention_heads")
    vocab = r.int("vocab_size", or_keys=("padded_vocab_size",))
    positions = r.int("max_position_embeddings", **({"default": arch["positions"]} if "positions" in arch else {}),
                      or_keys=("seq_length",))
    kv_heads = _kv_heads(r, heads)
    head_dim = r.int("head_dim", default=None, or_keys=("kv_channels",))
    if head_dim is None and hidden % heads:
        r.fail("num_attention_heads", f"does not divide hidden_size={hidden} and there is no head_dim "
                                      f"(valid head counts divide {hidden})")
    if heads % kv_heads:
        raise UsageError(f"{r.label}: num_key_value_heads={kv_heads} does not divide num_attention_heads={heads} "
                         f"(valid values divide {heads})")
    if head_dim is not None and head_dim * heads == hidden and "head_dim" not in r.data:
        head_dim = None  # kv_channels equal to hidden/heads: the derived one
    ffn_default = {"default": arch["ffn_times_hidden"] * hidden} if "ffn_times_hidden" in arch else {}
    ffn = r.int("intermediate_size", or_keys=("ffn_hidden_size",), **ffn_default)
    fields: dict[str, Any] = {
        "name": r.model_name,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "ffn_hidden": ffn,
        "vocab_size": vocab,
        "vocab_pad_to": 1,  # the table as the checkpoint stores it
        "max_positions": positions,
        "seq_len": min(positions, DEFAULT_SEQ_CAP),
        "tie_embeddings": r.bool("tie_word_embeddings", arch.get("tie", False)),
        "sliding_window": _window(r),
        "qk_norm": arch.get("qk_norm", "none"),
        **_biases(r, arch),
        **_norm(r, arch),
        **_mlp(r, arch),
        **_parallel(r, arch),
    }
    fields["position"] = "alibi" if r.bool("alibi", False) else "rope"
    fields["embed_multiplier"] = r.number("scale_emb", None) or r.number("embedding_multiplier", None)
    if fields["embed_multiplier"] == 1:
        fields["embed_multiplier"] = None
    for key in FOLDED_MULTIPLIERS:
        r.get(key)
    if r.bool("use_qk_norm", False):
        r.fail("use_qk_norm", "per-head LayerNorm weights on q and k (Command R+) are not modelled; valid: false")
    if not r.bool("post_layer_norm", True):
        r.fail("post_layer_norm", "a decoder without a final norm is not modelled; valid: true")
    if r.bool("apply_residual_connection_post_layernorm", False):
        r.fail("apply_residual_connection_post_layernorm", "a residual taken after the norm is not modelled; "
                                                           "valid: false")
    return r.make(LlamaConfig, fields, keys=FIELD_KEYS)


#: the config.json key behind each field a config check may name
FIELD_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
              "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn_hidden": "intermediate_size",
              "vocab_size": "vocab_size", "max_positions": "max_position_embeddings",
              "sliding_window": "sliding_window", "embed_multiplier": "scale_emb"}


def _kv_heads(r: HFKeys, heads: int) -> int:
    kv = r.int("num_key_value_heads", default=None, or_keys=("num_kv_heads",))
    multi_query = r.bool("multi_query_attention", False)
    groups = r.int("multi_query_group_num", default=None)
    if kv is None and multi_query and groups is not None:
        kv = groups
    if kv is None and r.bool("multi_query", False) and not r.bool("new_decoder_architecture", False):
        kv = 1  # Falcon 7B: one key and value head
    return kv or heads


def _window(r: HFKeys) -> int | None:
    window = r.int("sliding_window", default=None)
    use = r.get("use_sliding_window")
    if use is None:
        return window
    if not isinstance(use, bool):
        r.fail("use_sliding_window", "expected true or false")
    r.get("max_window_layers")
    if use:
        r.fail("use_sliding_window", "a window on the layers from max_window_layers on is not modelled; "
                                     "valid: false")
    return None


def _biases(r: HFKeys, arch: Mapping[str, Any]) -> dict[str, bool]:
    qkv = proj = mlp = False
    if r.bool("attention_bias", False):
        qkv, proj = True, arch.get("attention_bias") != "qkv"
    if r.bool("qkv_bias", False) or r.bool("add_qkv_bias", False) or arch.get("qkv_bias"):
        qkv = True
    if r.bool("add_bias_linear", False):
        proj = mlp = True
    if r.bool("mlp_bias", False):
        mlp = True
    for key in ("bias", "use_bias"):
        if r.bool(key, False):
            qkv = proj = True
            mlp = mlp or arch.get("bias") != "attention"
    return {"qkv_bias": qkv, "proj_bias": proj, "mlp_bias": mlp}


def _norm(r: HFKeys, arch: Mapping[str, Any]) -> dict[str, Any]:
    rms = r.get("rmsnorm")
    kind = r.get("norm_type")
    if rms is not None:
        if not isinstance(rms, bool):
            r.fail("rmsnorm", "expected true or false")
        norm = "rmsnorm" if rms else "layernorm"
    elif kind is not None:
        if kind not in ("layer_norm", "rms_norm", "layernorm", "rmsnorm"):
            r.fail("norm_type", "valid values are layer_norm, rms_norm")
        norm = "rmsnorm" if kind.startswith("rms") else "layernorm"
    elif "rms_norm_eps" not in r.data and any(r.get(key) is not None for key in LAYER_NORM_EPS):
        norm = "layernorm"
    else:
        norm = arch.get("norm", "rmsnorm")
    return {"norm": norm, "norm_bias": norm == "layernorm" and arch.get("norm_bias", True)}


def _mlp(r: HFKeys, arch: Mapping[str, Any]) -> dict[str, str]:
    key = next((k for k in ("hidden_act", "activation") if r.get(k) is not None), "hidden_act")
    act = r.get(key, arch.get("act", "silu"))
    if act in SILU:
        if arch.get("gated") is False:
            r.fail(key, f"model_type {r.model_type!r} has a GeLU MLP without a gate; valid: gelu")
        return {"mlp_act": "swiglu"}
    if act in GELU:
        return {"mlp_act": "geglu" if arch.get("gated", True) else "gelu"}
    r.fail(key, f"valid activations are {', '.join(SILU + GELU)}")


def _parallel(r: HFKeys, arch: Mapping[str, Any]) -> dict[str, Any]:
    parallel = arch.get("parallel_block", False)
    for key in ("parallel_attn", "use_parallel_residual"):
        parallel = r.bool(key, parallel)
    norms = 1
    if r.bool("new_decoder_architecture", False):  # Falcon 40B/180B: two norms, unless told one
        parallel, norms = True, r.int("num_ln_in_parallel_attn", default=2)
    else:
        r.get("num_ln_in_parallel_attn")
    if norms not in (1, 2):
        r.fail("num_ln_in_parallel_attn", "valid values are 1 and 2")
    return {"parallel_block": parallel, "parallel_norms": norms if parallel else 1}


READER = HFReader(
    read=read,
    requires=(("hidden_size",), ("num_hidden_layers", "num_layers"), ("num_attention_heads",),
              ("vocab_size", "padded_vocab_size")),
    reads=("intermediate_size", "ffn_hidden_size", "num_key_value_heads", "num_kv_heads", "multi_query_group_num",
           "multi_query_attention", "multi_query", "head_dim", "kv_channels", "max_position_embeddings", "seq_length",
           "tie_word_embeddings", "hidden_act", "activation", "attention_bias", "qkv_bias", "mlp_bias", "bias",
           "use_bias", "add_qkv_bias", "add_bias_linear", "rmsnorm", "norm_type", *LAYER_NORM_EPS, "sliding_window",
           "use_sliding_window", "max_window_layers", "parallel_attn", "use_parallel_residual",
           "new_decoder_architecture", "num_ln_in_parallel_attn", "alibi", "scale_emb", "embedding_multiplier",
           *FOLDED_MULTIPLIERS, "use_qk_norm", "post_layer_norm", "apply_residual_connection_post_layernorm"),
    model_types=MODEL_TYPES,
    generic=True,
)


def config_from_hf(source: Mapping[str, Any] | str | os.PathLike) -> LlamaConfig | None:
    """A :class:`LlamaConfig` from a config.json (dict or path) that has this family's required
    keys; ``None`` when it lacks them (another family's config)."""
    data, label = load_hf_config(source)
    if not READER.can_read(data):
        return None
    return read(HFKeys(data, label))


def to_hf(config: LlamaConfig, model_type: str | None = None) -> dict[str, Any]:
    """``config`` as a config.json dict; ``config_from_hf(to_hf(c)) == c`` when kv_heads is set.

    ``model_type`` defaults to qwen2 for a config with QKV bias only, mistral for one with
    a sliding window and llama otherwise; mistral is also valid for a config without
    either.  Fields a llama config.json has no key for (LayerNorm, parallel blocks, q/k
    norms...) are refused: those configs come from their own model's config.json.
    """
    c = config
    qkv_only = c.qkv_bias and not c.proj_bias
    mt = model_type or ("qwen2" if qkv_only else "mistral" if c.sliding_window else "llama")
    if mt not in EXPORT_TYPES:
        raise UsageError(f"model_type {mt!r}: valid values are {', '.join(EXPORT_TYPES)}")
    if (mt == "qwen2") != qkv_only:
        raise UsageError(
            f"model_type {mt!r} cannot express qkv_bias={c.qkv_bias}: qwen2 always has QKV bias, "
            f"llama and mistral have none on q, k, v alone"
        )
    if c.sliding_window is not None and mt != "mistral":
        raise UsageError(f"model_type {mt!r} cannot express sliding_window={c.sliding_window}: only mistral has "
                         f"a window in every layer")
    plain = LlamaConfig()
    for field in ("norm", "norm_bias", "qk_norm", "mlp_act", "parallel_block", "parallel_norms", "position",
                  "embed_multiplier"):
        if getattr(c, field) != getattr(plain, field):
            raise UsageError(f"LlamaConfig {field}={getattr(c, field)!r}: a {mt} config.json cannot express it")
    if c.proj_bias and (mt != "llama" or not c.qkv_bias):
        raise UsageError(f"LlamaConfig proj_bias=True: only llama's attention_bias (q, k, v and output) expresses it")
    out: dict[str, Any] = {
        "model_type": mt,
        "architectures": [ARCHITECTURES[mt]],
        "hidden_size": c.hidden,
        "intermediate_size": c.ffn_hidden,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.groups,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_positions,
        "tie_word_embeddings": c.tie_embeddings,
        "hidden_act": "silu",
    }
    if c.head_dim is not None:
        out["head_dim"] = c.head_dim
    if mt == "mistral":
        out["sliding_window"] = c.sliding_window
    if mt == "llama":
        out["attention_bias"] = c.proj_bias
        out["mlp_bias"] = c.mlp_bias
    elif c.mlp_bias:
        raise UsageError(f"LlamaConfig mlp_bias=True: a {mt} config.json cannot express it (llama's can)")
    out["stage"] = c.stage_block()
    return out
