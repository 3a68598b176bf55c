"""Mamba-1's selective scan as one registered kernel (``selective_scan``), with its FLOPs,
bytes and backward: what mamba_ssm's ``selective_scan_fn`` runs (Gu & Dao 2023, "Mamba",
arXiv 2312.00752, Algorithm 2 and section 3.3.2), registered through the core's kernel
registry and listed in the ``ModelSpec.kernels`` of the families with Mamba-1 layers.

Call: ``g.kernel("selective_scan", x, dt, A, B, C, D, z)`` with ``x``, ``dt`` and ``z``
[b, s, c] (c = d_inner channels; dt after dt_proj, before its softplus), ``A`` [c, n] (the
negative exponent of A_log; fp32), ``B`` and ``C`` [b, s, n], ``D`` [c] (fp32) -> ``y``
[b, s, c] (gated by silu(z), as the fused kernel does) and the state after the last
token [b, c, n] (what inference keeps).

FLOPs, counted term by term (no matmul: the recurrence is elementwise):

* per state element and token (:data:`SCAN_PER_STATE` = 7): exp(Δ·A) (a product and an
  exponential), h = exp(Δ·A)·h + (Δ·x)·B (two products and a sum), y += C·h (a product
  and a sum);
* per channel and token (:data:`SCAN_PER_CHANNEL` = 11): softplus(Δ) (3), Δ·x (1),
  y + D·x (2), y·silu(z) (5).

Bytes: x, Δ and z read and y written (4 per channel and token), B and C read (2 per
token and state index), A and D (fp32) read once, and the state the scan starts
from read and the one it ends with written (2 per channel and state element and
sequence) -- what a decode step costs per token, so the same kernel is the decode step at
s = 1.  The scan needs the whole sequence (``s`` whole); channels split freely (tensor
parallel holds a slice of d_inner, as vLLM's Mamba-1 does).

Backward (one kernel, :data:`SCAN_BWD_PER_STATE` = 20 and :data:`SCAN_BWD_PER_CHANNEL` =
14): the forward recurrence recomputed (the forward keeps no states: 5), the reverse
recurrence dh = exp(Δ·A)·dh' + C·dy (3), dC += h·dy (2), dB += dh·Δx (2), dΔ and dA
through exp(Δ·A) (6) and dx through B (2); per channel softplus' (3), dD += x·dy and
dx += D·dy (4), the gate's dz and dy (6), dx's Δ (1).  It reads x, Δ, A, B, C, D, z and
dy and writes every input's gradient.
"""

from __future__ import annotations

from stage_core.api import OTHER, Grads, KernelCall, KernelDef, KernelSpec

SCAN_PER_STATE = 7
SCAN_PER_CHANNEL = 11
SCAN_BWD_PER_STATE = 20
SCAN_BWD_PER_CHANNEL = 14
SPEC = "bsc,bsc,cn,bsn,bsn,c,bsc->bsc,bcn"


def _forward(call: KernelCall) -> KernelDef:
    x, dt, a, b, c, d, z = call.inputs
    if x.rank != 3 or a.rank != 2 or b.rank != 3 or d.rank != 1:
        raise ValueError("selective_scan takes x, dt, z [b, s, c], A [c, n], B, C [b, s, n] and D [c]")
    item = x.itemsize
    return KernelDef(
        spec=SPEC,
        flops=[(SCAN_PER_STATE, "bscn", OTHER), (SCAN_PER_CHANNEL, "bsc", OTHER)],
        bytes=[(4 * item, "bsc"), (2 * b.itemsize, "bsn"), (a.itemsize, "cn"), (d.itemsize, "c"),
               (2 * item, "bcn")],
        out_shapes=[x.shape, (x.shape[0], x.shape[2], a.shape[1])],
        out_dtypes=[x.dtype, x.dtype],
        whole=["s"],
    )


def _backward(g: Grads) -> list[KernelDef]:
    x, dt, a, b, c, d, z = g.inputs
    item = x.itemsize
    return [KernelDef(
        spec="bsc,bsc,bsc,cn,bsn,bsn,c,bsc->bsc,bsc,cn,bsn,bsn,c,bsc",
        reads=("dy", "x0", "x1", "x2", "x3", "x4", "x5", "x6"), grads=(0, 1, 2, 3, 4, 5, 6),
        flops=[(SCAN_BWD_PER_STATE, "bscn", OTHER), (SCAN_BWD_PER_CHANNEL, "bsc", OTHER)],
        bytes=[(7 * item, "bsc"), (4 * b.itemsize, "bsn"), (2 * a.itemsize, "cn"), (2 * d.itemsize, "c")],
        out_dtypes=[x.dtype, dt.dtype, a.dtype, b.dtype, c.dtype, d.dtype, z.dtype],
        reduce=["b", "s", "c"], whole=["s"],
    )]


SELECTIVE_SCAN = KernelSpec("selective_scan", _forward, _backward, "fused",
                            "Mamba-1's selective scan (mamba_ssm selective_scan_fn), gated by silu(z)")
