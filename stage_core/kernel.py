"""What a compute model sees of one kernel: its kind, local shapes, dtype and costs.

Lowering makes one :class:`Kernel` per op of a rank class (shared by every
micro-batch's copy of the op) and hangs it on the program's compute node; a compute
model (:class:`~stage_core.records.ComputeModelSpec`) turns it into a time on a GPU.

Shapes are the op's index equation (``"bsh,hf->bsf"``) and the size of each letter
on this rank (sharded letters already divided by their degrees).  For a contraction
:meth:`Kernel.gemm` reads the GEMM problem off the equation: letters on both
operands and the output are the batch, letters of one operand and the output are
M or N, letters of both operands missing from the output are K.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Mapping

#: op kinds whose FLOPs are tensor-core matmuls when they contract an index
MATMUL_KINDS = ("einsum",)
#: the fused attention kernels (forward, backward)
FLASH = ("flash_attention", "flash_attention_bwd")


@dataclass(frozen=True, slots=True)
class Gemm:
    """A (batched) matrix product: ``batch`` independent [m, k] x [k, n] products."""

    batch: int
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel as a compute model needs it.

    ``kind`` and ``fn`` are the op's (``einsum``, ``norm``/``rmsnorm``,
    ``fused``/``flash_attention``, ``optimizer``/``adam`` ...), ``phase`` is
    ``forward``, ``backward`` or ``optimizer``.  ``spec`` is the index equation and
    ``sizes`` the local size of each of its letters, as ``(letter, size)`` pairs.
    ``dtype`` is the element type of the first input (what the tensor cores run).
    ``flops`` counts every FLOP (2 per multiply-add), ``matmul_flops`` those of
    contractions only, ``bytes`` what the kernel reads and writes.  ``causal``: a fused
    attention kernel whose mask is causal, so it skips the masked half of its score space
    whatever convention its FLOPs are counted in (Megatron counts the whole s x s).
    """

    kind: str
    fn: str
    phase: str
    spec: str
    sizes: tuple[tuple[str, int], ...]
    dtype: str
    flops: int
    matmul_flops: int
    bytes: int
    causal: bool = False

    @property
    def letters(self) -> dict[str, int]:
        return dict(self.sizes)

    @property
    def is_flash(self) -> bool:
        return self.fn in FLASH

    def gemm(self) -> Gemm | None:
        """The GEMM problem of a contracting einsum with two operands, else None."""
        if self.kind not in MATMUL_KINDS or not self.matmul_flops or "->" not in self.spec:
            return None
        lhs, out = self.spec.split("->")
        operands = lhs.split(",")
        if len(operands) != 2:
            return None
        a, b = (set(t) for t in operands)
        o = set(out)
        size = self.letters
        batch = prod(size[c] for c in a & b & o)
        m = prod(size[c] for c in (a & o) - b)
        n = prod(size[c] for c in (b & o) - a)
        # contracted letters, and letters summed over one operand alone, are the K loop
        k = prod(size[c] for c in (a | b) - o)
        return Gemm(batch, m, n, k)


def kernel(kind: str, fn: str, phase: str, spec: str, sizes: Mapping[str, int], dtype: str, *,
           flops: int, matmul_flops: int, nbytes: int, causal: bool = False) -> Kernel:
    """A :class:`Kernel` with ``sizes`` given as a mapping."""
    return Kernel(kind, fn, phase, spec, tuple(sizes.items()), dtype, flops, matmul_flops, nbytes, causal)
