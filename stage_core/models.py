"""What model plugins share: a config base class, config checks, config.json reading, totals.

A family's config is a frozen dataclass deriving from :class:`ModelConfig`.  Its
fields are plain values (ints, floats, bools, strings), so a config round-trips
through ``to_dict``/``from_dict`` (manifests, ``--set key=value``) and compares
by value.  ``build`` functions take a config and return the forward graph over
the dims ``b`` (micro-batch size) and ``s`` (sequence length), which the plan
binds later, and the model's own dims, bound from the config in ``graph.dims``.

Besides :class:`ModelConfig`:

* field checks for a config's ``__post_init__`` (:func:`check_int`, :func:`check_bool`,
  :func:`check_choice`, :func:`check_divides`...), each raising :class:`UsageError`
  ``"<Class> <field>=<value>: <what is valid>"``, and :func:`padded`;
* :func:`load_hf_config` and :class:`HFKeys`: a Hugging Face ``config.json`` read from a
  dict, a file or a folder, and typed reads of its keys whose errors name the key;
* :func:`param_counts` and exact totals of a graph (:func:`evaluate_sum`,
  :func:`step_values`, :func:`training_flops`, :func:`flops_by_layer`, :func:`saved_bytes_per_layer`), what a
  plugin's tests compare with published parameter counts, FLOPs and memory formulas.

The standard layers (attention, MLPs, embedding, head) are in :mod:`stage_core.ir.blocks`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar, Mapping

from . import sym
from .errors import UsageError
from .inputs import read_json
from .ir.graph import Graph
from .ir.tensor import Role

#: dims every model graph uses and the plan (not the model) binds
PLAN_DIMS = ("b", "s")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Base of every family's config: ``name`` and ``family`` plus the family's fields.

    ``HF_STAGE_KEYS``: the fields a Hugging Face ``config.json`` carries in its optional
    ``"stage"`` object (STAGE's own settings, which Hugging Face has no key for).
    :meth:`HFKeys.make` reads that object for every family and :meth:`stage_block`
    writes it, so no plugin reads or forgets it on its own; a family extends the tuple
    for a setting of its own (fields it does not have are skipped).
    """

    HF_STAGE_KEYS: ClassVar[tuple[str, ...]] = ("name", "vocab_pad_to", "seq_len", "attention", "causal_flops",
                                                "dtype")
    #: what the plan's sequence length (``--seq-len``, the dim ``s``) is to this family:
    #: ``"tokens"``: the plan chooses it, the config's ``seq_len`` is the default (an LLM, BERT);
    #: ``"fixed"``: the config's ``seq_len`` is the only one (a ViT's patches, from its image size);
    #: ``"none"``: the graph has no sequence dim (an image CNN); the plan's micro-batch counts images
    SEQUENCE: ClassVar[str] = "tokens"

    name: str = ""
    family: str = ""

    @classmethod
    def hf_stage_keys(cls) -> tuple[str, ...]:
        """The ``"stage"`` keys of a config.json of this family (see ``HF_STAGE_KEYS``)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return tuple(k for k in cls.HF_STAGE_KEYS if k in names)

    def stage_block(self) -> dict[str, Any]:
        """The ``"stage"`` object of this config's config.json (``to_hf`` writes it)."""
        return {key: getattr(self, key) for key in self.hf_stage_keys()}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UsageError(
                f"unknown {cls.__name__} field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(names))}"
            )
        return cls(**dict(data))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def for_task(self, task: str):
        """The config whose graph computes this model the way ``task`` (``train``, ``prefill``,
        ``decode``) runs it: this one, unless a family's kernels take another form for a task
        (DeepSeek's MLA absorbs its key and value up-projections for decode)."""
        return self

    def with_overrides(self, overrides: Mapping[str, str]):
        """Apply ``--set key=value`` strings, converting each to the field's type.

        A key may also be a Hugging Face config.json key.  A config imported from a
        config.json is read again with those keys changed (``--set num_hidden_layers=4``
        is the same file with 4 layers: lists of one entry per layer are cut to the new
        count); any other config takes them through :meth:`hf_field` (``num_hidden_layers``
        -> ``layers``).  Field names are applied last.
        """
        fields = {f.name: f for f in dataclasses.fields(self)}
        hf = {k: v for k, v in overrides.items() if k not in fields}
        config = self
        if hf:
            source = getattr(self, HF_SOURCE_ATTR, None)
            if source is not None and any(_hf_key_known(source[0], k) for k in hf):
                config = reread_hf(self, hf)
            else:
                changed = dict(overrides)
                for key, raw in hf.items():
                    field = self.hf_field(key)
                    if field is None:
                        keys = ", ".join(sorted(k for k in self.HF_FIELDS if self.hf_field(k)))
                        raise UsageError(
                            f"--set {key}={raw}: {type(self).__name__} has no field {key!r} and it is no config.json "
                            f"key of this model; valid fields: {', '.join(sorted(fields))}; config.json keys: {keys}"
                        )
                    del changed[key]
                    changed.setdefault(field, raw)
                return config._with_fields(changed, fields)
        return config._with_fields({k: v for k, v in overrides.items() if k in fields}, fields)

    def _with_fields(self, overrides: Mapping[str, str], fields) -> "ModelConfig":
        hints = typing.get_type_hints(type(self))
        changes = {}
        for key, raw in overrides.items():
            changes[key] = _convert(key, raw, hints.get(key, str))
        if not changes:
            return self
        return keep_hf_import(self, dataclasses.replace(self, **changes))

    #: Hugging Face config.json key -> config field, for ``--set`` on a config that was not
    #: imported from a file (a family adds its own: ``HF_FIELDS = {**ModelConfig.HF_FIELDS, ...}``)
    HF_FIELDS: ClassVar[dict[str, str]] = {
        "num_hidden_layers": "layers", "n_layer": "layers", "num_layers": "layers", "n_layers": "layers",
        "hidden_size": "hidden", "n_embd": "hidden", "d_model": "hidden",
        "num_attention_heads": "heads", "n_head": "heads",
        "num_key_value_heads": "kv_heads", "num_kv_heads": "kv_heads", "multi_query_group_num": "kv_heads",
        "head_dim": "head_dim", "kv_channels": "head_dim",
        "intermediate_size": "ffn_hidden", "ffn_hidden_size": "ffn_hidden", "n_inner": "ffn_hidden",
        "vocab_size": "vocab_size", "padded_vocab_size": "vocab_size",
        "max_position_embeddings": "max_positions", "n_positions": "max_positions",
        "tie_word_embeddings": "tie_embeddings", "sliding_window": "sliding_window",
        "num_local_experts": "experts", "num_experts": "experts", "n_routed_experts": "experts",
        "num_experts_per_tok": "experts_per_token", "moe_intermediate_size": "expert_ffn_hidden",
    }

    def hf_field(self, key: str) -> str | None:
        """The field a config.json ``key`` sets in this config, or None."""
        field = self.HF_FIELDS.get(key)
        names = {f.name for f in dataclasses.fields(self)}
        return field if field in names else None


def _convert(key: str, raw: str, hint) -> Any:
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if raw.lower() in ("none", "null"):
            return None
        hint = args[0] if args else str
    try:
        if hint is bool:
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
    except ValueError:
        kind = {bool: "true or false", int: "an integer", float: "a number"}[hint]
        raise UsageError(f"--set {key}={raw}: expected {kind}") from None
    return raw


def param_counts(graph: Graph) -> tuple[int, int]:
    """(total, active) parameter counts of a model graph.

    Active counts what one token uses: a parameter tagged ``"expert"`` counts
    ``experts_per_token / experts`` of itself (``graph.meta``).
    """
    values = dict(graph.dims)
    for d in PLAN_DIMS:
        values.setdefault(d, 1)
    sizes = sym.exact_values([p.numel for p in graph.params], values)
    total = sum(sizes)
    k = graph.meta.get("experts_per_token")
    e = graph.meta.get("experts")
    active = 0
    for p, n in zip(graph.params, sizes):
        if "expert" in p.tags and k and e:
            active += n * k // e
        else:
            active += n
    return total, active


# ---------------------------------------------------------------------- exact totals of a graph
def evaluate_sum(exprs, values: Mapping[str, int]) -> int:
    """Exact sum of many symbolic expressions at ``values`` (identical ones evaluated once)."""
    counts = Counter(exprs)
    keys = list(counts)
    return sum(n * v for n, v in zip(counts.values(), sym.Evaluator(keys)(values)))


def step_values(graph: Graph, b: int = 1, s: int | None = None) -> dict[str, int]:
    """Every dim of a model graph bound: its own dims, ``b``, and ``s`` (default ``meta["seq_len"]``;
    not bound for a model without a sequence dim)."""
    values = dict(graph.dims)
    values["b"] = b
    s = s if s is not None else graph.meta.get("seq_len")
    if s is not None:
        values["s"] = s
    return values


def total(graph: Graph, what: str, values: Mapping[str, int], ops=None) -> int:
    """``what`` (``flops``, ``matmul_flops``, ``other_flops``, ``bytes``) summed over the kernels of ``ops``
    (default: every kernel of ``graph``) at ``values``."""
    return evaluate_sum([getattr(op, what) for op in graph.kernels(ops)], values)


def training_flops(graph: Graph, b: int = 1, s: int | None = None, what: str = "matmul_flops",
                   phase: str | None = None) -> int:
    """``what`` of one micro-batch through the training graph of the forward ``graph``
    (forward, backward and optimizer; ``phase``: only that phase's kernels)."""
    from .autodiff import differentiate

    tg = differentiate(graph)
    ops = [op for op in tg.kernels() if phase is None or op.phase == phase]
    return evaluate_sum([getattr(op, what) for op in ops], step_values(graph, b, s))


def flops_by_layer(graph: Graph, values: Mapping[str, int]) -> dict[int, int]:
    """FLOPs of each transformer layer's forward and backward kernels at ``values``
    (layer -> FLOPs), each distinct letter size evaluated once."""
    kernels = [op for op in graph.kernels() if op.layer is not None and op.phase != "optimizer"]
    sizes = list(dict.fromkeys(op.letter_sizes[c] for op in kernels for _, letters, _ in op.flop_terms
                                for c in letters))
    value = dict(zip(sizes, sym.Evaluator(sizes)(values)))
    out: dict[int, int] = {}
    for op in kernels:
        for coeff, letters, _ in op.flop_terms:
            n = 1
            for c in letters:
                n *= value[op.letter_sizes[c]]
            out[op.layer] = out.get(op.layer, 0) + int(_fraction(coeff) * n)
    return out


def _fraction(coeff) -> Fraction:
    """An int or a sympy rational coefficient, exactly."""
    return Fraction(coeff) if isinstance(coeff, int) else Fraction(int(coeff.p), int(coeff.q))


def saved_bytes_per_layer(training_graph: Graph, values: Mapping[str, int]) -> dict[int, int]:
    """Bytes of the activations each layer's forward ops keep for backward (layer -> bytes)."""
    per_layer: dict[int, dict] = {}
    for op in training_graph.forward_ops:
        if op.layer is None:
            continue
        for t in op.saved:
            if t.role is Role.ACTIVATION:
                per_layer.setdefault(op.layer, {})[t] = None
    return {layer: evaluate_sum([t.nbytes for t in ts], values) for layer, ts in per_layer.items()}


# ---------------------------------------------------------------------- config field checks
#: the dtypes a model's weights and activations may have
DTYPES = ("bf16", "fp16", "fp32")


def padded(size: int, multiple: int) -> int:
    """``size`` rounded up to a multiple of ``multiple`` (Megatron's vocabulary padding)."""
    return -(-size // multiple) * multiple


def _bad(cfg, field: str, what: str) -> UsageError:
    return UsageError(f"{type(cfg).__name__} {field}={getattr(cfg, field)!r}: {what}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_str(cfg, *fields: str) -> None:
    """Each field of ``cfg`` is a string (``GPTConfig name=3: expected a string``)."""
    for field in fields:
        if not isinstance(getattr(cfg, field), str):
            raise _bad(cfg, field, "expected a string")


def check_bool(cfg, *fields: str) -> None:
    """Each field is ``True`` or ``False`` (not 0, 1 or a string)."""
    for field in fields:
        if not isinstance(getattr(cfg, field), bool):
            raise _bad(cfg, field, "expected true or false")


def check_int(cfg, *fields: str, minimum: int = 1, optional: bool = False, why: str = "") -> None:
    """Each field is an integer >= ``minimum`` (a bool is not); ``optional``: ``None`` passes too.

    The message says "a positive integer" for ``minimum=1`` and adds ``why`` in
    parentheses when given.
    """
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    for field in fields:
        value = getattr(cfg, field)
        if value is None and optional:
            continue
        if not _is_int(value) or value < minimum:
            raise _bad(cfg, field, f"expected {what}" + (f" ({why})" if why else ""))


def is_positive_number(value) -> bool:
    """A finite int or float > 0 (a bool, NaN or infinity is not)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            and (isinstance(value, int) or math.isfinite(value)))


def check_positive_number(cfg, *fields: str, optional: bool = False) -> None:
    """Each field is a finite int or float > 0; ``optional``: ``None`` passes too."""
    for field in fields:
        value = getattr(cfg, field)
        if value is None and optional:
            continue
        if not is_positive_number(value):
            raise _bad(cfg, field, "expected a positive number")


def check_choice(cfg, field: str, valid: tuple[str, ...]) -> None:
    """The field is one of ``valid`` (``... attention='ring': valid values are flash, classic``)."""
    if getattr(cfg, field) not in valid:
        raise _bad(cfg, field, f"valid values are {', '.join(valid)}")


def check_divides(cfg, divisor: str, field: str, why: str = "") -> None:
    """Field ``divisor`` divides field ``field`` (both already checked ints; ``None`` passes).

    ``GPTConfig heads=5 does not divide hidden=128: <why>``.
    """
    d, n = getattr(cfg, divisor), getattr(cfg, field)
    if d is not None and n is not None and n % d:
        tail = f": {why}" if why else ""
        raise UsageError(f"{type(cfg).__name__} {divisor}={d} does not divide {field}={n}{tail}")


def check_at_most(cfg, field: str, limit: str, why: str = "") -> None:
    """Field ``field`` is at most field ``limit`` (``... seq_len=512 exceeds max_positions=256: <why>``)."""
    value, most = getattr(cfg, field), getattr(cfg, limit)
    if value > most:
        tail = f": {why}" if why else ""
        raise UsageError(f"{type(cfg).__name__} {field}={value} exceeds {limit}={most}{tail}")


# ---------------------------------------------------------------------- Hugging Face config.json
HF_LABEL = "config.json"
_REQUIRED: Any = object()
#: the attribute :meth:`HFKeys.make` leaves on a config it made (not a field: it does not
#: change the config's value, its dict or a round trip)
HF_IMPORT_ATTR = "_hf_import"


def hf_import_of(config) -> dict[str, Any] | None:
    """How ``config`` came from a config.json: ``{"source", "model_type", "ignored_keys"}``, or ``None``."""
    return getattr(config, HF_IMPORT_ATTR, None)


def keep_hf_import(source, config):
    """``config`` (a changed copy of ``source``, e.g. after ``--set``) with ``source``'s import record."""
    record = hf_import_of(source)
    if record is not None and hf_import_of(config) is None:
        object.__setattr__(config, HF_IMPORT_ATTR, record)
    return config


def load_hf_config(source: Mapping[str, Any] | str | os.PathLike) -> tuple[Mapping[str, Any], str]:
    """A parsed Hugging Face ``config.json`` and a label for messages.

    ``source`` is a mapping (returned as is, labelled ``config.json``), a path to the
    file, or a path to its folder (``<folder>/config.json``; the label is the path).
    Raises :class:`UsageError` when the file cannot be read, is not valid JSON or does
    not hold a JSON object.
    """
    if isinstance(source, Mapping):
        return source, HF_LABEL
    path = Path(source)
    if path.is_dir():
        path = path / HF_LABEL
    data = read_json(path, f"Hugging Face config {str(path)!r}")  # (regular files only, bounded in size and depth)
    if not isinstance(data, Mapping):
        raise UsageError(f"Hugging Face config {str(path)!r} must hold a JSON object")
    return data, str(path)


class HFKeys:
    """Typed reads of a ``config.json``'s keys; every :class:`UsageError` names the key.

    Messages start with ``label`` (the file, or ``config.json`` for a dict)::

        r = HFKeys.load(path)              # or HFKeys(mapping)
        hidden = r.int("hidden_size")      # required: "<label>: required key 'hidden_size' is missing ..."
        kv = r.int("num_key_value_heads", default=None)    # absent or null: None
        shared = r.int("n_shared_experts", default=0, minimum=0)
        if hidden % heads:
            r.fail("num_attention_heads", f"does not divide hidden_size={hidden}")
    """

    def __init__(self, data: Mapping[str, Any], label: str = HF_LABEL):
        self.data = data
        self.label = label
        self._read: set[str] = {"model_type"}  # it chose the family
        self._children: dict[str, "HFKeys"] = {}

    @classmethod
    def load(cls, source: Mapping[str, Any] | str | os.PathLike) -> "HFKeys":
        """Keys of a config.json given as :func:`load_hf_config` takes it."""
        return cls(*load_hf_config(source))

    @property
    def model_type(self):
        self._read.add("model_type")
        return self.data.get("model_type")

    @property
    def model_name(self) -> str:
        """``_name_or_path``, or ``hf-<model_type>``: the name of a config imported from here."""
        self._read.add("_name_or_path")
        return str(self.data.get("_name_or_path") or f"hf-{self.model_type}")

    def get(self, key: str, default: Any = None) -> Any:
        self._read.add(key)
        return self.data.get(key, default)

    def child(self, key: str) -> "HFKeys":
        """The object at ``key`` (Gemma 3's ``text_config``) as a reader of its own, labelled
        ``<label> <key>``; its unread keys count as ``<key>.<name>`` in :meth:`ignored`."""
        value = self.data.get(key)
        if not isinstance(value, Mapping):
            self.fail(key, "expected an object of keys")
        self._children[key] = HFKeys(value, f"{self.label} {key}")
        return self._children[key]

    def ignored(self) -> tuple[str, ...]:
        """The keys of the config.json nothing read: what STAGE does not model (dropout,
        rope scaling, initializers, token ids...), sorted; a child's as ``<key>.<name>``."""
        out = [str(k) for k in self.data if k not in self._read and k not in self._children]
        for key, child in self._children.items():
            out += [f"{key}.{k}" for k in child.ignored()]
        return tuple(sorted(out))

    def fail(self, key: str, message: str) -> typing.NoReturn:
        """Raise ``<label>: key '<key>'=<value>: <message>``."""
        raise UsageError(f"{self.label}: key {key!r}={self.data.get(key)!r}: {message}")

    def int(self, key: str, default: Any = _REQUIRED, *, minimum: int = 1, or_keys: tuple[str, ...] = ()):
        """The integer at ``key`` (>= ``minimum``; a bool is not an integer).

        ``or_keys``: older names read when ``key`` is absent or null (checked whenever
        present).  Without a
        ``default`` the key is required; with one, an absent or null key gives it.
        """
        self._read.update((key, *or_keys))
        found = None
        for k in (key, *or_keys):  # every name present must be valid; the first one counts
            value = self.data.get(k)
            if value is None:
                continue
            if not _is_int(value) or value < minimum:
                self.fail(k, "expected a positive integer" if minimum == 1 else f"expected an integer >= {minimum}")
            found = value if found is None else found
        if found is not None:
            return found
        if default is _REQUIRED:
            raise UsageError(f"{self.label}: required key {key!r} is missing (model_type {self.model_type!r})")
        return default

    def number(self, key: str, default: float) -> float:
        """The positive finite number (int or float) at ``key``; absent or null: ``default``."""
        value = self.get(key)
        if value is None:
            return default
        if not is_positive_number(value):
            self.fail(key, "expected a positive number")
        return value

    def bool(self, key: str, default: bool) -> bool:
        """The JSON ``true``/``false`` at ``key``; absent or null: ``default``."""
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(key, "expected true or false")
        return value

    def global_every(self, key: str, layers: int, default: int, local: tuple = ("sliding_attention",),
                     full: tuple = ("full_attention",)) -> int | None:
        """The period n of the global layers a per-layer list at ``key`` names (layer i global
        when (i + 1) is a multiple of n; 0: every layer local; ``None``: every layer global);
        absent or null: ``default``.  Entries are among ``local`` and ``full`` (a list longer
        than ``layers`` is read up to ``layers``)."""
        types = self.get(key)
        if types is None:
            return default
        if not isinstance(types, list) or len(types) < layers or any(t not in local + full for t in types):
            self.fail(key, f"expected a list of {layers} entries, each one of {', '.join(map(str, local + full))}")
        types = types[:layers]
        globals_ = [i for i, t in enumerate(types) if t in full]
        if len(globals_) == layers:
            return None
        if not globals_:
            return 0
        every = globals_[0] + 1
        if any((i + 1) % every == 0 for i in range(layers) if i not in globals_) or any((i + 1) % every
                                                                                        for i in globals_):
            self.fail(key, "STAGE models a periodic pattern (global layers where (i + 1) is a multiple of n); "
                           "this list is not periodic")
        return every

    def index_list(self, key: str) -> tuple[int, ...]:
        """A list of integers >= 0 (layer indices) at ``key``; absent or null: empty."""
        value = self.get(key) or []
        if not isinstance(value, list) or any(not _is_int(v) or v < 0 for v in value):
            self.fail(key, "expected a list of layer indices")
        return tuple(value)

    def stage_section(self, valid: tuple[str, ...]) -> dict[str, Any]:
        """The optional ``"stage"`` object: STAGE's own settings config.json has no key for.

        Its keys must be among ``valid`` (config field names); absent: ``{}``.
        """
        section = self.get("stage")
        if section is None:
            return {}
        keys = ", ".join(valid) or "none"
        if not isinstance(section, Mapping):
            raise UsageError(f"{self.label}: key 'stage' must be an object with keys among: {keys}")
        unknown = sorted(map(str, set(section) - set(valid)))
        if unknown:
            raise UsageError(
                f"{self.label}: unknown key(s) stage.{', stage.'.join(unknown)}; valid: {keys}"
            )
        return dict(section)

    def make(self, config_class, fields: Mapping[str, Any], keys: Mapping[str, str] | None = None):
        """``config_class(**fields)`` with the config.json's ``"stage"`` object applied over
        ``fields`` (keys from ``config_class.hf_stage_keys()``).

        A :class:`UsageError` of the config's own checks comes back prefixed with the label
        and, when it is about a field ``keys`` maps to a config.json key (``{"ssm_groups":
        "n_groups"}``), naming that key first.  The config records what was read and what
        was not (:func:`hf_import_of`: the keys this config.json has that nothing modelled).
        """
        stage_keys = config_class.hf_stage_keys() if hasattr(config_class, "hf_stage_keys") else ()
        fields = {**fields, **self.stage_section(stage_keys)}
        try:
            config = config_class(**fields)
        except UsageError as exc:
            message = str(exc)
            field = message.removeprefix(f"{config_class.__name__} ").split("=", 1)[0]
            key = (keys or {}).get(field)
            if key is not None and message.startswith(f"{config_class.__name__} {field}="):
                message = f"key {key!r}: {message}"
            raise UsageError(f"{self.label}: {message}") from None
        object.__setattr__(config, HF_IMPORT_ATTR, {"source": self.label, "model_type": self.data.get("model_type"),
                                                    "ignored_keys": list(self.ignored())})
        return config


# ---------------------------------------------------------------------- reading a config.json by its keys
#: the attribute :func:`read_hf` leaves on a config it made: ``(config.json data, reader)``,
#: what ``--set <config.json key>=...`` reads again (not a field, like :data:`HF_IMPORT_ATTR`)
HF_SOURCE_ATTR = "_hf_source"


@dataclasses.dataclass(frozen=True)
class HFReader:
    """How a model family reads a Hugging Face ``config.json``: by the keys it has.

    ``read(keys)`` takes an :class:`HFKeys` and returns the family's config (raising
    :class:`UsageError` naming the key for a value it cannot model).  ``requires``: the
    facts it cannot do without, each a tuple of the key names that may carry it
    (``("num_hidden_layers", "num_layers", "n_layer")``): one of them present and not
    null.  ``reads``: every other key it reads, the evidence that a config is of this
    family (``num_local_experts``...).  ``model_types``: the ``model_type`` values known
    to import (a hint: the family is chosen for them when its required keys are there,
    and it may use the hint for what a config has no key for, such as Qwen3's q/k norm).
    ``generic``: the family to take, among those equally placed, when nothing else
    decides (the plain decoder).
    """

    read: typing.Callable[["HFKeys"], Any]
    requires: tuple[tuple[str, ...], ...]
    reads: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()
    generic: bool = False

    def keys(self) -> set[str]:
        """Every key this family places."""
        return {k for alts in self.requires for k in alts} | set(self.reads)

    def can_read(self, data: Mapping[str, Any]) -> bool:
        """Whether ``data`` (a parsed config.json) has every key this family requires."""
        return not _missing(self, hf_keys_present(data))


def hf_keys_present(data: Mapping[str, Any]) -> set[str]:
    """The keys of a config.json with a value (not null), a ``text_config``'s too (a multimodal
    model's decoder, as Gemma 3 and Llama 4 nest it)."""
    out = {str(k) for k, v in data.items() if v is not None}
    child = data.get("text_config")
    if isinstance(child, Mapping):
        out |= {str(k) for k, v in child.items() if v is not None}
    return out


def _model_types(data: Mapping[str, Any]) -> set[str]:
    types = {data.get("model_type")}
    child = data.get("text_config")
    if isinstance(child, Mapping):
        types.add(child.get("model_type"))
    return {t for t in types if isinstance(t, str)}


def _dominates(other: HFReader, reader: HFReader) -> bool:
    """Whether ``other`` requires a fact ``reader`` cannot place at all (MoE's experts, for a
    dense decoder's reader): a config it can read is not ``reader``'s, whatever its model_type."""
    keys = reader.keys()
    return any(not keys & set(alts) for alts in other.requires)


def _missing(reader: HFReader, present: set[str]) -> list[tuple[str, ...]]:
    return [alts for alts in reader.requires if not present & set(alts)]


def choose_hf_family(data: Mapping[str, Any], readers: Mapping[str, HFReader]) -> str:
    """The family whose keys ``data`` has: the one its ``model_type`` names (when no other
    family that can read it requires a key that one cannot place, as experts for a dense
    decoder; a named family missing a required key is that error), else among the families
    whose required keys are all there the one placing the most of its keys (the generic
    one on a tie, then by name).  :class:`UsageError` when none can read it:
    the nearest family, the keys it misses, and the keys no family places."""
    present = hf_keys_present(data)
    types = _model_types(data)
    able = [name for name, r in readers.items() if not _missing(r, present)]
    for name in sorted(n for n, r in readers.items() if types & set(r.model_types)):
        if any(_dominates(readers[other], readers[name]) for other in able if other != name):
            continue  # the config has keys of another family this one cannot place (experts...)
        if name in able:
            return name
        missing = " or ".join(_missing(readers[name], present)[0])
        raise UsageError(f"config.json of model_type {data.get('model_type')!r} (family {name}): required key "
                         f"{missing} is missing")
    if able:
        return min(able, key=lambda n: (-len(present & readers[n].keys()), not readers[n].generic, n))
    raise UsageError(hf_refusal(data, readers))


def hf_refusal(data: Mapping[str, Any], readers: Mapping[str, HFReader]) -> str:
    """The one line for a config.json no family reads."""
    present = hf_keys_present(data)
    mt = data.get("model_type")
    if not readers:
        return f"config.json of model_type {mt!r}: no installed model plugin reads config.json files"
    def rank(n):
        missing = len(_missing(readers[n], present))
        return -(len(readers[n].requires) - missing), -len(present & readers[n].keys()), not readers[n].generic, n

    nearest = min(readers, key=rank)
    types = sorted({t for r in readers.values() for t in r.model_types})
    missing = "; ".join(" or ".join(alts) for alts in _missing(readers[nearest], present))
    placed = set().union(*(r.keys() for r in readers.values())) | {"model_type", "architectures", "stage"}
    unplaced = sorted(present - placed)
    shown = ", ".join(unplaced[:12]) + (f" and {len(unplaced) - 12} more" if len(unplaced) > 12 else "")
    return (f"config.json of model_type {mt!r}: no model family reads it; the nearest, {nearest}, needs "
            f"{missing}" + (f"; keys no family places: {shown}" if unplaced else "")
            + f"; give --family NAME to read it as one of: {', '.join(sorted(readers))} (model_types known to "
              f"import: {', '.join(types)})")


def read_hf(data: Mapping[str, Any], readers: Mapping[str, HFReader], family: str | None = None,
            label: str = HF_LABEL):
    """The config ``data`` (a parsed config.json) describes, read by the family
    :func:`choose_hf_family` picks, or by ``family`` when given (``--family``)."""
    if family is None:
        family = choose_hf_family(data, readers)
    elif family not in readers:
        raise UsageError(f"--family {family}: no family of that name reads config.json files; "
                         f"valid: {', '.join(sorted(readers)) or 'none installed'}")
    reader = readers[family]
    keys = HFKeys(data, label)
    missing = _missing(reader, hf_keys_present(data))
    if missing:
        raise UsageError(f"{label}: family {family} needs key {' or '.join(missing[0])}, which is missing "
                         f"(model_type {data.get('model_type')!r})")
    config = reader.read(keys)
    record = hf_import_of(config)
    if record is not None:
        record["family"] = getattr(config, "family", family)
    object.__setattr__(config, HF_SOURCE_ATTR, (dict(data), reader))
    return config


def _hf_key_known(data: Mapping[str, Any], key: str) -> bool:
    child = data.get("text_config")
    return key in data or (isinstance(child, Mapping) and key in child)


def _json_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def reread_hf(config, overrides: Mapping[str, str]):
    """``config`` read again from its config.json with ``overrides`` (config.json keys, or
    field names applied after) changed.  A changed layer count cuts every list (or string)
    of one entry per layer to the new count."""
    data, reader = getattr(config, HF_SOURCE_ATTR)
    names = {f.name for f in dataclasses.fields(config)}
    new = {k: (dict(v) if k == "text_config" and isinstance(v, Mapping) else v) for k, v in data.items()}
    fields = {}
    for key, raw in overrides.items():
        if not _hf_key_known(data, key):
            if key in names:
                fields[key] = raw
                continue
            raise UsageError(f"--set {key}={raw}: no field {key!r} and no such key in the config.json; valid fields: "
                             f"{', '.join(sorted(names))}, or a key of the config.json")
        where = new if key in data else new["text_config"]
        old, value = where[key], _json_value(raw)
        where[key] = value
        if _is_int(old) and _is_int(value) and value < old:
            for obj in (new, new.get("text_config")):
                if isinstance(obj, dict):
                    for k, v in obj.items():
                        if isinstance(v, (list, str)) and len(v) == old and k != key:
                            obj[k] = v[:value]
    record = hf_import_of(config) or {}
    again = reader.read(HFKeys(new, record.get("source", HF_LABEL)))
    again_record = hf_import_of(again)
    if again_record is not None and "family" in record:
        again_record["family"] = record["family"]
    object.__setattr__(again, HF_SOURCE_ATTR, (new, reader))
    if fields:
        return again.with_overrides(fields)
    return again


# ---------------------------------------------------------------------- what a model's layers are
#: a layer's block scopes as ``stage models FILE`` names them
BLOCK_NAMES = {"attn": "attention", "mlp": "mlp", "moe": "moe", "mamba": "mamba", "shared": "shared block"}


def layer_kinds(graph: Graph) -> dict[str, int]:
    """How many layers of each kind a model graph has, in order of first appearance: the
    blocks each layer holds by their scope (``layers.<i>.<block>.``), attention with its
    window when local (``{"attention (window 128) + moe": 12, "attention + moe": 12}``)."""
    blocks: dict[int, dict[str, None]] = {}
    windows: dict[int, set] = {}
    for op in graph.ops:
        if op.layer is None:
            continue
        parts = op.name.split(".")
        scope = parts[2] if len(parts) > 3 and parts[0] == "layers" else None
        if scope is None or op.kind in ("norm", "view") or parts[-1].endswith(("residual", "norm")):
            continue  # a block's norm and residual add: the layer's plumbing, not a block of its own
        blocks.setdefault(op.layer, {})[BLOCK_NAMES.get(scope, scope)] = None
        if op.attrs.get("window"):
            windows.setdefault(op.layer, set()).add(op.attrs["window"])
    out: dict[str, int] = {}
    for layer in sorted(blocks):
        names = []
        for name in blocks[layer]:
            if name == "attention" and windows.get(layer):
                name += f" (window {', '.join(map(str, sorted(windows[layer])))})"
            names.append(name)
        kind = " + ".join(names)
        out[kind] = out.get(kind, 0) + 1
    return out
