"""Measured tables as STAGE reads them: kernel times and collective times, one CSV each.

A table is CSV with a header; lines starting with ``#`` are comments (say where the
numbers come from there).  Times are medians in microseconds (column ``us``); sizes in
bytes; ``name`` is a free label.

Kernel tables (``op`` one of ``gemm``, ``flash_fwd``, ``flash_bwd``, ``memory``)::

    op,dtype,batch,m,n,k,heads,kv_heads,head_dim,seq_q,seq_k,causal,bytes,us,name
    gemm,fp16,1,4096,28672,4096,,,,,,,,1234.5,llama3-8b mlp_up_proj tp1 4096 tokens
    flash_fwd,fp16,1,,,,32,4,128,,2048,2048,1,,456.7,llama2-70b tp2 prefill 2048
    memory,fp16,,,,,,,,,,,,33554432,21.2,rmsnorm 4096 x 4096

* ``gemm``: ``batch`` (default 1) products of [m, k] x [k, n];
* ``flash_fwd``/``flash_bwd``: fused attention of ``heads`` query heads over
  ``kv_heads`` key/value heads of ``head_dim``, ``seq_q`` queries against ``seq_k`` keys
  (``seq_k - seq_q`` of them cached before the first query), ``causal`` 1 or 0;
* ``memory``: an elementwise kernel bounded by the ``bytes`` it reads and writes;
  ``norm``: a normalization (a reduction over each row, then the scaling), likewise.

Collective tables (``op`` one of ``all_reduce``, ``all_gather``, ``reduce_scatter``,
``all_to_all``, ``send``)::

    op,ranks,ranks_per_node,bytes,us,name
    all_reduce,8,8,67108864,675.0,dgx-a100 nccl all_reduce 64 MiB

``ranks`` GPUs, ``ranks_per_node`` of them in each node; ``bytes`` is ASTRA-sim's
``comm_size``: the buffer of an all-reduce or all-to-all, each rank's shard of an
all-gather, each rank's whole input of a reduce-scatter, a send's message.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from stage_core.api import DTYPE_BYTES, Kernel, UsageError, kernel, read_text

KERNEL_OPS = ("gemm", "flash_fwd", "flash_bwd", "memory", "norm")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")
#: the largest table read
MAX_TABLE_BYTES = 256 << 20


@dataclass(frozen=True)
class KernelPoint:
    kernel: Kernel
    seconds: float
    name: str
    op: str


@dataclass(frozen=True)
class CollectivePoint:
    op: str
    ranks: int
    ranks_per_node: int
    bytes: int
    seconds: float
    name: str


def kind_of(path: Path) -> str:
    """``"kernels"`` or ``"collectives"``: what a CSV table holds, from its header."""
    header = _header(_lines(path))
    if "ranks" in header:
        return "collectives"
    if "op" in header:
        return "kernels"
    raise UsageError(f"{path}: not a kernel or collective table (its header names no 'op' column; see "
                     f"`stage calibrate --help`)")


def read_kernels(path: Path) -> list[KernelPoint]:
    """The kernels of a kernel table; a bad row is one UsageError naming its line."""
    return [_kernel_point(row, f"{path}:{line}") for line, row in _rows(path, ("op", "us"))]


def read_collectives(path: Path) -> list[CollectivePoint]:
    out = []
    for line, row in _rows(path, ("op", "ranks", "ranks_per_node", "bytes", "us")):
        where = f"{path}:{line}"
        op = row["op"]
        if op not in COLLECTIVE_OPS:
            raise UsageError(f"{where}: op {op!r} is not a collective; valid: {', '.join(COLLECTIVE_OPS)}")
        ranks, per_node = _int(row, "ranks", where), _int(row, "ranks_per_node", where)
        if ranks < 2 or per_node > ranks or ranks % per_node:
            raise UsageError(f"{where}: ranks {ranks} with ranks_per_node {per_node}: a collective needs 2 or more "
                             "ranks in whole nodes of ranks_per_node")
        out.append(CollectivePoint(op, ranks, per_node, _int(row, "bytes", where), _seconds(row, where),
                                   row.get("name") or ""))
    return out


# --------------------------------------------------------------------------- kernels


def gemm_kernel(batch: int, m: int, n: int, k: int, dtype: str = "bf16", width: int | None = None) -> Kernel:
    """``batch`` products [m, k] x [k, n] of ``dtype`` (elements of ``width`` bytes)."""
    spec, sizes = ("mk,kn->mn", {"m": m, "k": k, "n": n}) if batch == 1 else (
        "bmk,bkn->bmn", {"b": batch, "m": m, "k": k, "n": n})
    flops = 2 * batch * m * n * k
    width = width or DTYPE_BYTES.get(dtype, 2)
    return kernel("einsum", "", "forward", spec, sizes, dtype, flops=flops, matmul_flops=flops,
                  nbytes=width * batch * (m * k + k * n + m * n))


def flash_kernel(backward: bool, batch: int, heads: int, kv_heads: int, head_dim: int, seq_q: int, seq_k: int,
                 causal: bool, dtype: str = "bf16") -> Kernel:
    """The kernel ``GraphBuilder.flash_attention`` makes (or its backward) for these shapes;
    FLOPs counted over the whole score space."""
    sizes = {"b": batch, "s": seq_q, "g": kv_heads, "r": heads // kv_heads, "d": head_dim, "k": seq_k}
    scores = batch * heads * seq_q * seq_k
    width = DTYPE_BYTES.get(dtype, 2)
    q = width * batch * seq_q * heads * head_dim
    kv = width * batch * seq_k * kv_heads * head_dim
    lse = 4 * batch * heads * seq_q
    if backward:
        spec = "bsgrd,bsgrd,bkgd,bkgd,bsgrd,bgrs->bsgrd,bkgd,bkgd"
        fn, matmul, nbytes = "flash_attention_bwd", 10 * head_dim * scores, 4 * q + 4 * kv + lse
    else:
        spec = "bsgrd,bkgd,bkgd->bsgrd,bgrs"
        fn, matmul, nbytes = "flash_attention", 4 * head_dim * scores, 2 * q + 2 * kv + lse
    return kernel("fused", fn, "backward" if backward else "forward", spec, sizes, dtype, flops=matmul,
                  matmul_flops=matmul, nbytes=nbytes, causal=causal)


def memory_kernel(nbytes: int, dtype: str = "bf16", norm: bool = False) -> Kernel:
    """A memory-bound kernel of ``nbytes`` (a normalization's kind is ``norm``, as lowering's)."""
    return kernel("norm" if norm else "elementwise", "memory", "forward", "n->n", {"n": nbytes}, dtype, flops=0,
                  matmul_flops=0, nbytes=nbytes)


def _kernel_point(row: dict, where: str) -> KernelPoint:
    op = row["op"]
    if op not in KERNEL_OPS:
        raise UsageError(f"{where}: op {op!r} is not a kernel; valid: {', '.join(KERNEL_OPS)} (a collective table "
                         "has the columns op,ranks,ranks_per_node,bytes,us)")
    dtype = row.get("dtype") or "bf16"
    if op == "gemm":
        batch = _int(row, "batch", where, default=1)
        k = gemm_kernel(batch, _int(row, "m", where), _int(row, "n", where), _int(row, "k", where), dtype)
    elif op in ("memory", "norm"):
        k = memory_kernel(_int(row, "bytes", where), dtype, norm=op == "norm")
    else:
        heads, kv = _int(row, "heads", where), _int(row, "kv_heads", where)
        if heads % kv:
            raise UsageError(f"{where}: heads {heads} is not a multiple of kv_heads {kv}")
        seq_q, seq_k = _int(row, "seq_q", where), _int(row, "seq_k", where)
        if seq_k < seq_q:
            raise UsageError(f"{where}: seq_k {seq_k} is below seq_q {seq_q} (keys include the queries' own)")
        k = flash_kernel(op == "flash_bwd", _int(row, "batch", where, default=1), heads, kv,
                         _int(row, "head_dim", where), seq_q, seq_k, _int(row, "causal", where, default=1) == 1, dtype)
    return KernelPoint(k, _seconds(row, where), row.get("name") or "", op)


# --------------------------------------------------------------------------- CSV


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines that are not blank or comments."""
    text = read_text(path, str(path), MAX_TABLE_BYTES)
    return [(i, line) for i, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.lstrip().startswith("#")]


def _header(lines: list[tuple[int, str]]) -> list[str]:
    if not lines:
        raise UsageError("empty table: no header line")
    return [c.strip() for c in next(csv.reader([lines[0][1]]))]


def _rows(path: Path, required: tuple[str, ...]):
    lines = _lines(path)
    if not lines:
        raise UsageError(f"{path}: empty table (no header line)")
    header = _header(lines)
    missing = [c for c in required if c not in header]
    if missing:
        raise UsageError(f"{path}: the header lacks column {missing[0]!r} (it has {', '.join(header)})")
    if len(lines) == 1:
        raise UsageError(f"{path}: a header and no rows")
    for number, line in lines[1:]:
        values = next(csv.reader([line]))
        if len(values) > len(header):
            raise UsageError(f"{path}:{number}: {len(values)} values for {len(header)} columns")
        yield number, {key: value.strip() for key, value in zip(header, values)}


def _int(row: dict, key: str, where: str, default: int | None = None) -> int:
    value = row.get(key, "")
    if value == "" and default is not None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{where}: {key} {value!r} is not a whole number") from None
    if number < 1 and key != "causal":
        raise UsageError(f"{where}: {key} {number} must be 1 or more")
    return number


def _seconds(row: dict, where: str) -> float:
    value = row.get("us", "")
    try:
        us = float(value)
    except ValueError:
        raise UsageError(f"{where}: us {value!r} is not a number of microseconds") from None
    if not 0 < us < math.inf:
        raise UsageError(f"{where}: us {value!r} must be a positive finite number of microseconds")
    return us * 1e-6
