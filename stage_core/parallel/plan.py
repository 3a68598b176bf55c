"""The parallel plan: degrees, strategies' switches, batch shape, dtypes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import isqrt
from typing import Any

from ..errors import UsageError
from ..tasks import DECODE, PREFILL, SERVE, TASKS, TRAIN

AXES = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
MOE_DISPATCHERS = ("alltoall", "allgather")
RECOMPUTE = ("none", "selective", "full")
#: context-parallel attention: TransformerEngine's ring, Llama 3's K/V all-gather, DeepSpeed-Ulysses
CP_COMM = ("p2p", "all-gather", "a2a")
ZERO_STAGES = (0, 1, 2, 3)
GRAD_DTYPES = ("bf16", "fp16", "fp32")
OPTIMIZER_DTYPES = ("fp32", "bf16")

# One place for what a plan flag accepts: Plan.check_basic checks these and the CLI
# builds --help from them (stage_core.cli's _count_flag and _choice_flag).  A new
# plan field with a fixed list of values adds a row to CHOICES; a new count, to COUNTS.

#: Plan fields that count something: positive integers
COUNTS = ("dp", "tp", "pp", "cp", "ep", "virtual_stages", "micro_batch_size", "micro_batches", "decode_steps")
#: Plan fields whose value is one of a fixed list, and that list
CHOICES: dict[str, tuple] = {
    "zero": ZERO_STAGES,
    "recompute": RECOMPUTE,
    "cp_comm": CP_COMM,
    "grad_dtype": GRAD_DTYPES,
    "optimizer_dtype": OPTIMIZER_DTYPES,
    "task": TASKS,
    "moe_dispatcher": MOE_DISPATCHERS,
}


def flag(field: str) -> str:
    """The command-line flag of a Plan field (``micro_batches`` -> ``--micro-batches``)."""
    return "--" + field.replace("_", "-")


def is_count(value) -> bool:
    """A positive integer (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class Plan:
    """How one step of a task is run across GPUs.

    The global batch is ``micro_batch_size * micro_batches * dp`` sequences of
    ``seq_len`` tokens; cp splits each sequence.  World size is ``tp*cp*dp*pp``; ep
    is carved out of ``dp*cp`` (Megatron-Core's expert view of the same ranks).

    ``task`` (:mod:`stage_core.tasks`): ``train``; ``prefill`` (the batch is prompts
    of ``seq_len`` tokens); ``decode`` (one new token per request, ``seq_len`` 1,
    attending to ``context_len`` cached tokens, the new one included, over
    ``decode_steps`` chained steps).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor parallel degree; None: tp
    moe_dispatcher: str = "alltoall"  # how routed tokens reach their experts (Megatron's token dispatchers)
    moe_capacity_factor: float | None = None  # None: the model's (dropless unless it sets one)
    moe_imbalance: float = 1.0  # rows of the busiest expert over the uniform share (dropless routing)
    sp: bool = False
    zero: int = 0
    recompute: str = "none"
    schedule: str = "1f1b"
    virtual_stages: int = 1
    seq_len: int | None = None
    micro_batch_size: int = 1
    micro_batches: int = 1
    order: str = DEFAULT_ORDER
    grad_dtype: str = "bf16"  # gradient buffers and their data-parallel reduction (Megatron: fp32 main grads)
    optimizer_dtype: str = "fp32"
    bucket_params: int | None = None  # gradient bucket size in parameters; None = Megatron's default
    stage_layers: tuple[int, ...] | str | None = None  # layers per pipeline chunk, "auto", or None: even split
    cp_comm: str = "p2p"  # how attention meets the keys of other context-parallel ranks (CP_COMM)
    task: str = TRAIN
    context_len: int | None = None  # decode: tokens each request attends to at the first step
    decode_steps: int = 1
    #: the strategies' own options (``OptionSpec``), as sorted (name, value) pairs: only those
    #: given, so two plans that choose the same things are equal
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def inference(self) -> bool:
        return self.task != TRAIN

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def expert_tp(self) -> int:
        """The expert layers' tensor-parallel degree (``etp``, by default tp)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """The expert layers' data-parallel degree: tp·cp·dp / (etp·ep) (Megatron-Core)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    def degrees(self) -> dict[str, int]:
        """Every mesh axis's degree: tp, cp, dp, pp, and the expert view's etp, ep, edp."""
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp,
                "etp": self.expert_tp, "ep": self.ep, "edp": self.expert_dp}

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.micro_batches * self.dp

    def degree(self, axis: str) -> int:
        return getattr(self, axis)

    def option(self, name: str, default: Any = None) -> Any:
        """The value of the strategy option ``name`` (``default`` when the plan does not set it)."""
        for key, value in self.options:
            if key == name:
                return value
        return default

    def with_options(self, **values: Any) -> "Plan":
        """The plan with these options set (``shard_group=8`` sets ``shard-group``; None removes one)."""
        merged = dict(self.options)
        for key, value in values.items():
            key = key.replace("_", "-")
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return self.replace(options=tuple(sorted(merged.items())))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **kw) -> "Plan":
        return dataclasses.replace(self, **kw)

    def check_basic(self) -> None:
        """Checks that need no model: positive degrees, known names, a valid order."""
        for name in COUNTS:
            if not is_count(getattr(self, name)):
                raise UsageError(f"{flag(name)} {getattr(self, name)}: must be a positive integer (1 or more)")
        if self.seq_len is not None and not is_count(self.seq_len):
            raise UsageError(f"--seq-len {self.seq_len}: must be a positive integer")
        for name, valid in CHOICES.items():
            value = getattr(self, name)
            if type(value) is not type(valid[0]) or value not in valid:
                raise UsageError(f"{flag(name)} {value}: valid values are {', '.join(map(str, valid))}")
        self.check_task()
        parts = self.order.split("-")
        if sorted(parts) != sorted(AXES):
            raise UsageError(
                f"--order {self.order}: must name each of {', '.join(AXES)} once, joined by '-', "
                f"fastest-varying first (default {DEFAULT_ORDER})"
            )
        if self.sp and self.tp == 1:
            raise UsageError("--sp needs --tp above 1 (sequence parallel splits the sequence over the TP group)")
        if self.etp is not None and not is_count(self.etp):
            raise UsageError(f"--etp {self.etp}: must be a positive integer (1 or more)")
        inner = self.tp * self.cp * self.dp
        if self.expert_tp == self.tp and (self.dp * self.cp) % self.ep:
            raise UsageError(
                f"--ep {self.ep}: expert parallel is carved out of dp*cp = {self.dp * self.cp}; "
                f"ep must divide it (valid: {', '.join(str(d) for d in divisors(self.dp * self.cp))})"
            )
        if inner % self.expert_tp:
            raise UsageError(
                f"--etp {self.expert_tp}: expert layers split tp*cp*dp = {inner} ranks into etp x ep x edp, so etp "
                f"must divide {inner} (valid --etp: {', '.join(map(str, divisors(inner)))})")
        if inner % (self.expert_tp * self.ep):
            valid = [d for d in divisors(inner) if inner % (d * self.expert_tp) == 0]
            raise UsageError(
                f"--ep {self.ep} with --etp {self.expert_tp}: expert layers split tp*cp*dp = {inner} ranks into "
                f"etp x ep x edp, so etp*ep must divide {inner} (valid --ep: {', '.join(map(str, valid))})"
            )
        cf = self.moe_capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 0 < cf < float("inf")):
            raise UsageError(f"--moe-capacity-factor {cf}: must be a positive finite number (e.g. 1.25), or omitted "
                             f"for dropless routing")
        imb = self.moe_imbalance
        if isinstance(imb, bool) or not isinstance(imb, (int, float)) or not 1 <= imb < float("inf"):
            raise UsageError(f"--moe-imbalance {imb}: the busiest expert's rows over the uniform share; "
                             f"must be 1 or more")
        if self.virtual_stages > 1 and self.pp == 1:
            raise UsageError("--virtual-stages above 1 needs --pp above 1")
        if self.stage_layers is not None:
            self._check_stage_layers()
        if self.zero and self.dp * self.cp == 1:
            raise UsageError(f"--zero {self.zero} shards model state over the data parallel ranks (dp x cp); it "
                             f"needs --dp or --cp above 1")

    def check_task(self) -> None:
        """The flags of a task that other tasks do not take, and the settings only training has."""
        if self.context_len is not None and not is_count(self.context_len):
            raise UsageError(f"--context-len {self.context_len}: must be a positive integer (1 or more)")
        decoding = self.task in (DECODE, SERVE)
        if self.decode_steps > 1 and not decoding:
            raise UsageError(f"--decode-steps {self.decode_steps}: chains decode steps; it needs --task decode "
                             f"(or serve), not {self.task}")
        if self.context_len is not None and not decoding:
            raise UsageError(f"--context-len {self.context_len}: the tokens a decode step attends to; it needs "
                             f"--task decode (or serve); {self.task} uses --seq-len")
        if self.task == TRAIN:
            return
        training_only = [(self.zero, f"--zero {self.zero}", "ZeRO shards gradients and optimizer state"),
                         (self.recompute != "none", f"--recompute {self.recompute}", "recompute saves activations "
                          "for backward"),
                         (self.sp, "--sp", "sequence parallel saves training activations")]
        for given, flag, why in training_only:
            if given:
                raise UsageError(f"{flag}: {why}; --task {self.task} has no backward (use --task train)")
        if self.cp > 1 and self.task == DECODE:
            raise UsageError(f"--cp {self.cp}: context parallel splits long prompts; it applies to --task "
                             f"{PREFILL} (decode has one token per request)")

    def _check_stage_layers(self) -> None:
        value = self.stage_layers
        text = ",".join(map(str, value)) if isinstance(value, tuple) else value
        if self.pp == 1:
            raise UsageError(f"--stage-layers {text}: needs --pp above 1 (it gives the layers of each pipeline stage)")
        if value == "auto":
            return
        # the first chunk may be the embedding alone and the last the head alone (0 layers: Llama 3's
        # balance, arXiv 2407.21783 section 3.3.2); every other chunk runs a layer at least
        if not isinstance(value, tuple) or not value or any(
                not isinstance(n, int) or isinstance(n, bool) or n < (0 if i in (0, len(value) - 1) else 1)
                for i, n in enumerate(value)):
            raise UsageError(f"--stage-layers {text}: expected auto or one layer count per stage, comma-separated "
                             f"(e.g. 7,8,8,7): positive, but the first and last may be 0 (a stage of the "
                             f"embedding or the head alone)")


def parse_stage_layers(text: str) -> tuple[int, ...] | str:
    """``"auto"`` or ``"7,8,8,7"`` (the --stage-layers flag) as the Plan field; ``NxK`` stands
    for K stages of N layers (``"7,8x14,7"``)."""
    text = text.strip()
    if text == "auto":
        return text
    try:
        out: list[int] = []
        for part in text.split(","):
            count, times = part.split("x") if "x" in part else (part, "1")
            if int(times) < 1:
                raise ValueError(part)
            out += [int(count)] * int(times)
        return tuple(out)
    except ValueError:
        raise UsageError(f"--stage-layers {text}: expected auto or one layer count per stage, comma-separated "
                         f"(e.g. 7,8,8,7; NxK for K stages of N: 7,8x14,7)") from None


def divisors(n: int, trials: int = 10**6) -> list[int]:
    """The divisors of ``n`` >= 1, ascending, found by at most ``trials`` trial divisions
    (exact up to ``trials**2``; above it, those up to ``trials`` and their cofactors)."""
    small, large = [], []
    for d in range(1, min(isqrt(n), trials) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]

