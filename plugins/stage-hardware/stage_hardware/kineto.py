"""Kernels of a PyTorch profiler (Kineto) trace, as the kernels STAGE times.

A Kineto trace is Chrome trace-event JSON (``torch.profiler.profile(...,
record_shapes=True).export_chrome_trace(path)``): ``{"traceEvents": [...]}`` with

* ``cat: "cpu_op"`` events, one per ATen operator call, whose ``args`` hold
  ``"External id"``, ``"Input Dims"`` (one list of sizes per input) and ``"Input
  type"`` (``"c10::BFloat16"``, ``"float"``...);
* ``cat: "kernel"`` events, one per GPU kernel, with ``dur`` in microseconds and the
  ``"External id"`` of the operator that launched them (older traces give only a
  ``"correlation"`` id, shared with the ``cat: "cuda_runtime"`` launch that carries the
  operator's ``"External id"``).

Each operator's kernels are summed into one sample: a :class:`~stage_core.kernel.Kernel`
built from the operator's input shapes (matrix products as einsums, FlashAttention
forward and backward, anything else as a memory-bound kernel of the bytes its inputs
and output take) and the seconds its kernels ran.  Communication kernels (NCCL) are
not compute and are left out.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any, Iterable

from stage_core.api import Kernel, UsageError, kernel, read_input

from . import tables

DTYPE_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4,
               "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2, "c10::Float8_e4m3fn": 1,
               "c10::Float8_e5m2": 1}
DTYPE_NAMES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8",
               "c10::Float8_e5m2": "fp8"}
FLASH_FORWARD = ("aten::_flash_attention_forward", "aten::_efficient_attention_forward")
FLASH_BACKWARD = ("aten::_flash_attention_backward", "aten::_efficient_attention_backward")


@dataclass
class Profile:
    """What a profile gave: the samples, and what could not be used."""

    samples: list[tuple[Kernel, float]] = field(default_factory=list)
    kernel_seconds: float = 0.0  # every compute kernel
    unmapped: dict[str, float] = field(default_factory=dict)  # kernel name -> seconds with no operator

    @property
    def mapped_seconds(self) -> float:
        return sum(t for _, t in self.samples)


#: the largest profile read (its JSON, after gzip): a long training step's trace is
#: hundreds of MB
MAX_PROFILE_BYTES = 4 << 30


def load_events(path: Path) -> list[dict]:
    raw = read_input(path, str(path), MAX_PROFILE_BYTES)  # a regular file (a FIFO would block)
    try:
        if raw[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as unzipped:
                raw = unzipped.read(MAX_PROFILE_BYTES + 1)
            if len(raw) > MAX_PROFILE_BYTES:
                raise UsageError(f"{path}: unpacks to more than {MAX_PROFILE_BYTES:,} bytes")
        doc = json.loads(raw)
    except (ValueError, EOFError, OSError, RecursionError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise UsageError(f"{path}: not a PyTorch profiler trace (not JSON: {why})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise UsageError(f"{path}: not a PyTorch profiler trace (no traceEvents list)")
    return [e for e in events if isinstance(e, dict)]


def _dims(args: dict, i: int) -> list[int]:
    dims = args["Input Dims"][i]
    if not isinstance(dims, list) or not all(_size(x) for x in dims):
        raise ValueError(f"input {i}: {dims!r} is not a list of sizes")
    return dims


def _size(x: Any) -> bool:
    return type(x) is int and 0 <= x < 1 << 40


def _key(value: Any) -> Any:
    """An id of the profile (External id, correlation), or None for a value that cannot be one."""
    return value if type(value) in (int, str) else None


def _operator_kernel(name: str, args: dict) -> Kernel | None:
    """The Kernel of an ATen operator call from its recorded input shapes, or None."""
    if not isinstance(args, dict):
        return None
    dims = args.get("Input Dims")
    types = args.get("Input type", [])
    if not isinstance(dims, list) or not dims or not isinstance(types, list):
        return None
    types = [t if isinstance(t, str) else "" for t in types]
    first = next((t for t, d in zip(types, dims) if d), "")
    dtype = DTYPE_NAMES.get(first, "bf16")
    item = DTYPE_BYTES.get(first, 2)
    try:
        if name == "aten::mm":
            (m, k), (_, n) = _dims(args, 0), _dims(args, 1)
            return _gemm(1, m, n, k, dtype, item)
        if name == "aten::addmm":
            (m, k), (_, n) = _dims(args, 1), _dims(args, 2)
            return _gemm(1, m, n, k, dtype, item)
        if name == "aten::bmm":
            (b, m, k), (_, _, n) = _dims(args, 0), _dims(args, 1)
            return _gemm(b, m, n, k, dtype, item)
        if name == "aten::baddbmm":
            (b, m, k), (_, _, n) = _dims(args, 1), _dims(args, 2)
            return _gemm(b, m, n, k, dtype, item)
        if name == "aten::linear":
            x, w = _dims(args, 0), _dims(args, 1)
            return _gemm(1, prod(x[:-1]), w[0], x[-1], dtype, item)
        if name in FLASH_FORWARD or name in FLASH_BACKWARD:
            backward = name in FLASH_BACKWARD
            q, k = (_dims(args, 1), _dims(args, 2)) if backward else (_dims(args, 0), _dims(args, 1))
            b, s_q, heads, d = q
            # the profile does not say whether the mask was causal: counted as a full one
            return tables.flash_kernel(backward, b, heads, k[2], d, s_q, k[1], False, dtype)
    except (ValueError, IndexError, TypeError):
        return None
    if not all(isinstance(d, list) and all(map(_size, d)) for d in dims):
        return None
    sizes = [prod(d) * DTYPE_BYTES.get(t, 0) for d, t in zip(dims, types) if d]
    if not sizes:
        return None
    nbytes = sum(sizes) + max(sizes)  # the inputs, and an output as large as the largest
    return kernel("norm" if "norm" in name else "memory", name, "", "", {}, dtype, flops=0, matmul_flops=0,
                  nbytes=nbytes)


def _gemm(b: int, m: int, n: int, k: int, dtype: str, item: int) -> Kernel:
    return tables.gemm_kernel(b, m, n, k, dtype, item)


def _is_communication(name: str) -> bool:
    return "nccl" in name.lower()


def read(path: Path) -> Profile:
    """The samples of the profile at ``path``."""
    events = load_events(path)
    ops: dict[Any, dict] = {}
    runtime: dict[Any, Any] = {}
    kernels: list[dict] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat", ""), e.get("args")
        args = args if isinstance(args, dict) else {}
        if cat in ("cpu_op", "Operator") and _key(args.get("External id")) is not None:
            ops[args["External id"]] = e
        elif cat in ("cuda_runtime", "Runtime") and _key(args.get("correlation")) is not None \
                and _key(args.get("External id")) is not None:
            runtime[args["correlation"]] = args["External id"]
        elif cat in ("kernel", "Kernel"):
            kernels.append(e)
    per_op: dict[Any, float] = {}
    out = Profile()
    for e in kernels:
        name, dur = str(e.get("name", "")), e.get("dur", 0)
        if isinstance(dur, bool) or not isinstance(dur, (int, float)) or not 0 <= dur < math.inf:
            raise UsageError(f"{path}: kernel {name[:60]!r} at ts {e.get('ts')!r}: dur {dur!r} is not a "
                             f"duration (microseconds, a finite number of 0 or more)")
        seconds = dur * 1e-6
        if _is_communication(name):
            continue
        out.kernel_seconds += seconds
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        ext = _key(args.get("External id"))
        if ext is None:
            ext = runtime.get(_key(args.get("correlation")))
        if ext in ops:
            per_op[ext] = per_op.get(ext, 0.0) + seconds
        else:
            out.unmapped[name] = out.unmapped.get(name, 0.0) + seconds
    for ext, seconds in per_op.items():
        op = ops[ext]
        k = _operator_kernel(str(op.get("name", "")), op.get("args"))
        if k is None:
            out.unmapped[str(op.get("name"))] = out.unmapped.get(str(op.get("name")), 0.0) + seconds
        else:
            out.samples.append((k, seconds))
    return out


def classes(samples: Iterable[tuple[Kernel, float]]) -> dict[str, int]:
    """How many samples of each kernel class (what the fit can learn from)."""
    counts: dict[str, int] = {}
    for k, _ in samples:
        cls = k.fn if k.is_flash else ("gemm" if k.matmul_flops else "memory-bound")
        counts[cls] = counts.get(cls, 0) + 1
    return counts
