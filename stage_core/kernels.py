"""The kernel registry: kernels a model plugin adds, with their costs and their backward.

A kernel is declared once, as a :class:`KernelSpec`, and listed in the
``ModelSpec.kernels`` of the families that use it; the registration is scoped to those
models' graphs (no other model, and no global table, sees it).  A model calls it with
``g.kernel("conv2d", x, w, name="conv1", stride=2, padding=3)``.

``forward(call)`` says what one call is (:class:`KernelDef`): an index equation over the
call's inputs and outputs, one letter per dim (``"bchw,ockl->bopq"``), and cost terms
over those letters.  The letters also say how the kernel reads under each placement, as
for the core's own ops (``docs/design.md``, "Sharding propagation"):

* a letter on an input and an output stays sharded through the kernel (a batch, a
  channel dim);
* a letter in ``reduce`` is summed linearly: sharded, the output is Partial (a
  contracted channel), and the strategies' collectives complete the sum;
* a letter in ``whole`` is needed whole: sharded, it is gathered first (a convolution's
  image rows);
* ``partial_ok``: the kernel is a sum of its inputs (Partial in, Partial out).

``backward(grads)`` returns the backward kernels, each a :class:`KernelDef` that names
what it reads (``reads``: ``"dy"`` the output's gradient (``"dy1"`` the second
output's), ``"x0"``.. the forward inputs, ``"y0"``.. the forward outputs) and the forward
inputs whose gradients it writes (``grads``).  What the backward reads of the forward is
what the model keeps for backward: activation memory counts exactly those tensors.  A
backward kernel whose gradients no one needs is not emitted (a first layer's input).  In
a zero-bubble schedule's split backward, a kernel that writes only parameter gradients
runs in W, the others in B (``weight`` overrides).

:data:`STANDARD` holds the kernels the core provides for plugins to list: ``conv2d``
(stride, padding, dilation, groups), ``relu``, ``batchnorm`` (over chosen letters),
``maxpool``/``avgpool`` (and their global forms) and ``mean``/``sum`` to any shape,
a scalar included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import sympy as sp

from . import sym
from .ir.ops import MATMUL, OTHER, parse_spec
from .ir.tensor import Tensor

_REF = re.compile(r"^(dy|x|y)(\d*)$")


@dataclass(frozen=True)
class KernelDef:
    """One kernel call: its index equation and costs (see the module docstring).

    ``flops``: ``(coefficient, letters, "matmul" | "other")`` terms, FLOPs =
    coefficient x the product of the letters' sizes (2 per multiply-add for a matmul);
    ``bytes``: ``(bytes per element, letters)`` terms, by default every operand read or
    written once; ``out_shapes`` (default: each output letter's size from the inputs)
    and ``out_dtypes`` (default: the first input's); ``free_letters``: sizes of letters
    only the cost terms use (a pooling window's taps).  Backward kernels also set
    ``reads`` and ``grads``.
    """

    spec: str
    flops: Sequence[tuple] = ()
    bytes: Sequence[tuple] | None = None
    out_shapes: Sequence[Sequence] | None = None
    out_dtypes: Sequence[str] | None = None
    reduce: Sequence[str] = ()
    whole: Sequence[str] = ()
    partial_ok: bool = False
    free_letters: Mapping[str, Any] = field(default_factory=dict)
    attrs: Mapping[str, Any] = field(default_factory=dict)
    reads: Sequence[str] = ()
    grads: Sequence[int] = ()
    weight: bool | None = None


@dataclass(frozen=True)
class KernelCall:
    """What ``forward`` sees of one call: the input tensors, the keyword parameters given
    to ``g.kernel(...)`` and the graph's dims (to turn a parameter into a number)."""

    inputs: tuple[Tensor, ...]
    params: Mapping[str, Any]
    dims: Mapping[str, int]

    def param(self, name: str, default: Any = None) -> Any:
        return self.params.get(name, default)

    def number(self, value: Any) -> int:
        """``value`` (an int or an expression of the graph's dims) as an int."""
        e = sym.expr(value).xreplace({s: sp.Integer(self.dims[s.name]) for s in sym.expr(value).free_symbols
                                      if s.name in self.dims})
        if e.free_symbols or not e.is_Integer:
            raise ValueError(f"{value!r} is not a whole number of the graph's dims")
        return int(e)


@dataclass(frozen=True)
class Grads:
    """What ``backward`` sees: the forward call, its outputs, the forward equation's
    input and output terms, and which inputs need a gradient."""

    call: KernelCall
    outputs: tuple[Tensor, ...]
    spec: str
    needs: tuple[bool, ...]
    attrs: Mapping[str, Any]

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self.call.inputs

    @property
    def params(self) -> Mapping[str, Any]:
        return self.call.params

    @property
    def terms(self) -> tuple[list[str], list[str]]:
        return parse_spec(self.spec)


@dataclass(frozen=True)
class KernelSpec:
    """A kernel a model plugin registers (list it in ``ModelSpec.kernels``).

    ``forward(call) -> KernelDef``; ``backward(grads) -> [KernelDef, ...]`` (None: no
    gradient flows through it, as through an arg-max).  ``kind`` is what compute models
    see as ``Kernel.kind`` (``"fused"`` by default; ``"elementwise"``, ``"reduction"``...).
    """

    name: str
    forward: Callable[[KernelCall], KernelDef]
    backward: Callable[[Grads], Sequence[KernelDef]] | None = None
    kind: str = "fused"
    description: str = ""
    plugin: str = ""


class KernelError(ValueError):
    """A registered kernel returned something the host cannot use."""


def check_def(d: Any, name: str, n_inputs: int, n_outputs: int | None = None) -> tuple[list[str], list[str]]:
    """The terms of ``d``'s equation, after checking ``d`` is a usable KernelDef."""
    if not isinstance(d, KernelDef):
        raise KernelError(f"kernel {name}: returned a {type(d).__name__}, not a KernelDef")
    try:
        ins, outs = parse_spec(d.spec)
    except ValueError as exc:
        raise KernelError(f"kernel {name}: {exc}") from None
    if len(ins) != n_inputs:
        raise KernelError(f"kernel {name}: equation {d.spec!r} has {len(ins)} inputs for {n_inputs} tensors")
    if n_outputs is not None and len(outs) != n_outputs:
        raise KernelError(f"kernel {name}: equation {d.spec!r} has {len(outs)} outputs for {n_outputs} gradients")
    letters = set("".join(ins + outs)) | set(d.free_letters)
    for term in d.flops:
        if len(term) != 3 or term[2] not in (MATMUL, OTHER):
            raise KernelError(f"kernel {name}: FLOP term {term!r} is not (coefficient, letters, 'matmul'|'other')")
        if set(term[1]) - letters:
            raise KernelError(f"kernel {name}: FLOP term {term!r} uses letters the equation lacks: "
                              f"{''.join(sorted(set(term[1]) - letters))}")
    for term in d.bytes or ():
        if len(term) != 2 or set(term[1]) - letters:
            raise KernelError(f"kernel {name}: byte term {term!r} is not (bytes per element, letters of the equation)")
    for what, group in (("reduce", d.reduce), ("whole", d.whole)):
        if set(group) - letters:
            raise KernelError(f"kernel {name}: {what} letters {''.join(sorted(set(group) - letters))} are not in "
                              f"{d.spec!r}")
    return ins, outs


def resolve_ref(ref: str, name: str, inputs, outputs, out_grads) -> Tensor:
    """The tensor a backward kernel's ``reads`` entry names."""
    m = _REF.match(ref)
    if m is None:
        raise KernelError(f"kernel {name}: backward reads {ref!r}; name 'dy' (or 'dy1'...), 'x0'..., 'y0'...")
    what, index = m.group(1), int(m.group(2) or 0)
    pool = {"dy": out_grads, "x": inputs, "y": outputs}[what]
    if index >= len(pool):
        raise KernelError(f"kernel {name}: backward reads {ref!r}, but the kernel has {len(pool)} "
                          f"{'outputs' if what != 'x' else 'inputs'}")
    got = pool[index]
    if got is None:
        raise KernelError(f"kernel {name}: backward reads {ref!r}, which has no gradient here")
    return got


# --------------------------------------------------------------------------- the standard kernels
# FLOP counts per element (one per arithmetic operation, as stage_core.ir.kernels counts):
#   relu fwd max(x, 0): 1; bwd dy * (y > 0): 1
#   batchnorm (training) fwd per element: sum, subtract mean, square, sum, * rstd, * gamma, + beta = 7 (as
#     layernorm); bwd: 11 (as layernorm's); the fp32 mean and variance per channel are written
#   max pooling: one comparison per tap; bwd scatters dy to the arg-max (0 FLOPs, 1 write)
#   average pooling: one add per tap and a divide per output; bwd one multiply per tap
_RELU = (1, 1)
_BATCHNORM = (7, 11)
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _pair(value, what: str) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{what}={value!r}: give one number or two (rows, columns)")
        return int(value[0]), int(value[1])
    return int(value), int(value)


def conv_out(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output rows of a convolution or pooling window (PyTorch's formula)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _conv2d(call: KernelCall) -> KernelDef:
    """``x`` [b, c, h, w] conv ``w`` [o, c/groups, kh, kw] (+ ``bias`` [o]) -> [b, o, p, q].

    Letters: b batch, c input channels, o output channels, h w the image, p q the
    output, e the input channels each output channel reads (c/groups), k l the taps.
    FLOPs: 2 per multiply-add, b·o·p·q·e·kh·kw multiply-adds (+ one add per output for a
    bias).  The image is needed whole (h w in ``whole``); without groups c is contracted
    (sharded over tp: a Partial output, row parallel); o may be sharded (column parallel);
    with groups each output channel reads only its group's inputs, so c is needed whole."""
    x, w, *rest = call.inputs
    stride = _pair(call.param("stride", 1), "stride")
    padding = _pair(call.param("padding", 0), "padding")
    dilation = _pair(call.param("dilation", 1), "dilation")
    groups = int(call.param("groups", 1))
    if x.rank != 4 or w.rank != 4:
        raise ValueError("conv2d takes x [b, c, h, w] and a weight [o, c/groups, kh, kw]")
    c, e = call.number(x.shape[1]), call.number(w.shape[1])
    if groups < 1 or c % groups or e * groups != c or call.number(w.shape[0]) % groups:
        raise ValueError(f"conv2d: groups={groups} must divide the {c} input and {call.number(w.shape[0])} output "
                         f"channels, and the weight must read c/groups = {c // max(groups, 1)} of them (it reads {e})")
    h, wd = call.number(x.shape[2]), call.number(x.shape[3])
    kh, kw = call.number(w.shape[2]), call.number(w.shape[3])
    p = conv_out(h, kh, stride[0], padding[0], dilation[0])
    q = conv_out(wd, kw, stride[1], padding[1], dilation[1])
    if p < 1 or q < 1:
        raise ValueError(f"conv2d: a {kh}x{kw} window over a {h}x{wd} image gives no output")
    ws = "ockl" if groups == 1 else "oekl"
    spec = f"bchw,{ws}->bopq"
    terms = [(2, f"bopq{ws[1]}kl", MATMUL)]
    item = x.itemsize
    nbytes = [(item, "bchw"), (w.itemsize, ws), (item, "bopq")]
    if rest:
        spec = f"bchw,{ws},o->bopq"
        terms.append((1, "bopq", OTHER))
        nbytes.append((rest[0].itemsize, "o"))
    reduce, whole = (["c", "k", "l"], ["h", "w"]) if groups == 1 else (["e", "k", "l"], ["c", "h", "w"])
    # bytes: the image, the weights and the output once each (an implicit GEMM's traffic is close to its operands')
    return KernelDef(spec=spec, flops=terms, bytes=nbytes, out_shapes=[(x.shape[0], w.shape[0], p, q)],
                     reduce=reduce, whole=whole,
                     attrs={"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
                            "taps": (kh, kw), "image": (h, wd)})


def _conv2d_backward(g: Grads) -> list[KernelDef]:
    """dgrad (dy, w -> dx) and wgrad (dy, x -> dw), each as many multiply-adds as the
    forward; a bias gradient sums dy over b, p, q."""
    x, w = g.inputs[0], g.inputs[1]
    grouped = g.attrs.get("groups", 1) != 1
    ws = "oekl" if grouped else "ockl"
    item = x.itemsize
    out = [
        KernelDef(spec=f"bopq,{ws}->bchw", reads=("dy", "x1"), grads=(0,), flops=[(2, f"bopq{ws[1]}kl", MATMUL)],
                  reduce=["o", "k", "l"], whole=["p", "q"],
                  bytes=[(item, "bopq"), (w.itemsize, ws), (item, "bchw")]),
        KernelDef(spec=f"bopq,bchw->{ws}", reads=("dy", "x0"), grads=(1,), flops=[(2, f"bopq{ws[1]}kl", MATMUL)],
                  reduce=["b", "p", "q"], whole=["h", "w"] + (["c"] if grouped else []),
                  bytes=[(item, "bopq"), (item, "bchw"), (w.itemsize, ws)]),
    ]
    if len(g.inputs) == 3:
        out.append(KernelDef(spec="bopq->o", reads=("dy",), grads=(2,), flops=[(1, "bopq", OTHER)],
                             reduce=["b", "p", "q"]))
    return out


def _relu(call: KernelCall) -> KernelDef:
    (x,) = call.inputs
    t = _LETTERS[:x.rank]
    return KernelDef(spec=f"{t}->{t}", flops=[(_RELU[0], t, OTHER)], partial_ok=False)


def _relu_backward(g: Grads) -> list[KernelDef]:
    t = _LETTERS[:g.inputs[0].rank]
    return [KernelDef(spec=f"{t},{t}->{t}", reads=("dy", "y0"), grads=(0,), flops=[(_RELU[1], t, OTHER)])]


def _batchnorm(call: KernelCall) -> KernelDef:
    """BatchNorm in training: ``x`` normalized per channel (dim ``channel``, default 1) over
    every other dim, scaled by ``gamma`` and shifted by ``beta`` [c].

    The batch dim (0) keeps its sharding: each data-parallel rank normalizes with its own
    statistics, as PyTorch's BatchNorm under DDP does; with ``sync=True`` the kernel
    all-reduces its fp32 per-channel sum and sum of squares over the ranks instead
    (SyncBatchNorm: 8 bytes per channel, and again in backward).  The other normalized
    dims are needed whole.  The backward reads the input and gamma (the per-channel
    statistics it also keeps are a few bytes per channel)."""
    x, gamma, beta = call.inputs
    t = _LETTERS[:x.rank]
    c = t[int(call.param("channel", 1))]
    over = "".join(letter for letter in t if letter != c)
    whole = over if call.param("sync", False) else over[1:]
    sync = {letter: (("all_reduce", c, 8),) for letter in over} if call.param("sync", False) else {}
    return KernelDef(spec=f"{t},{c},{c}->{t}", flops=[(_BATCHNORM[0], t, OTHER)], whole=list(whole),
                     attrs={"sharded_whole": sync, "over": over} if sync else {"over": over})


def _batchnorm_backward(g: Grads) -> list[KernelDef]:
    x = g.inputs[0]
    t = _LETTERS[:x.rank]
    c = t[int(g.params.get("channel", 1))]
    over = "".join(letter for letter in t if letter != c)
    synced = bool(g.params.get("sync", False))
    attrs = {"sharded_whole": {letter: (("all_reduce", c, 8),) for letter in over}} if synced else {}
    # dx needs the sums of dy and dy·x-hat over the normalized dims; dgamma and dbeta are those sums
    return [KernelDef(spec=f"{t},{t},{c}->{t},{c},{c}", reads=("dy", "x0", "x1"), grads=(0, 1, 2),
                      flops=[(_BATCHNORM[1], t, OTHER)], reduce=[] if synced else [over[0]],
                      whole=list(over if synced else over[1:]), attrs=attrs)]


def _pool(kind: str):
    def forward(call: KernelCall) -> KernelDef:
        """``x`` [b, c, h, w] -> [b, c, p, q]: a ``size`` window every ``stride`` (default the
        size) with ``padding``; ``size="global"`` pools the whole image to [b, c]."""
        (x,) = call.inputs
        if x.rank != 4:
            raise ValueError(f"{kind}: takes x [b, c, h, w]")
        h, w = call.number(x.shape[2]), call.number(x.shape[3])
        size = call.param("size", 2)
        per_tap = 1
        if size == "global":
            return KernelDef(spec="bchw->bc", flops=[(per_tap, "bchw", OTHER)]
                             + ([(1, "bc", OTHER)] if kind == "avgpool" else []),
                             reduce=["h", "w"] if kind == "avgpool" else [], whole=["h", "w"] if kind == "maxpool"
                             else [], attrs={"window": "global"})
        kh, kw = _pair(size, "size")
        stride = _pair(call.param("stride", (kh, kw)), "stride")
        padding = _pair(call.param("padding", 0), "padding")
        p, q = conv_out(h, kh, stride[0], padding[0], 1), conv_out(w, kw, stride[1], padding[1], 1)
        if p < 1 or q < 1:
            raise ValueError(f"{kind}: a {kh}x{kw} window over a {h}x{w} image gives no output")
        terms = [(per_tap, "bcpqkl", OTHER)] + ([(1, "bcpq", OTHER)] if kind == "avgpool" else [])
        attrs = {"window": (kh, kw), "stride": stride, "padding": padding}
        out = (x.shape[0], x.shape[1], p, q)
        if kind == "maxpool":  # PyTorch's max_pool2d_with_indices: the int64 arg-max of each window, for backward
            return KernelDef(spec="bchw->bcpq,bcpq", flops=terms, out_shapes=[out, out],
                             out_dtypes=[x.dtype, "int64"], whole=["h", "w"], free_letters={"k": kh, "l": kw},
                             attrs=attrs)
        return KernelDef(spec="bchw->bcpq", flops=terms, out_shapes=[out], whole=["h", "w"],
                         free_letters={"k": kh, "l": kw}, attrs=attrs)

    def backward(g: Grads) -> list[KernelDef]:
        x = g.inputs[0]
        window = g.attrs.get("window")
        if window == "global":
            return [KernelDef(spec="bc->bchw" if kind == "avgpool" else "bc,bchw->bchw",
                              reads=("dy",) if kind == "avgpool" else ("dy", "x0"), grads=(0,),
                              flops=[(1, "bchw", OTHER)], out_shapes=None)]
        kh, kw = window
        free = {"k": kh, "l": kw}
        if kind == "maxpool":  # the gradient goes to each window's arg-max (the indices forward kept; PyTorch
            # keeps the input too): one add per output element, dx written once
            return [KernelDef(spec="bcpq,bchw,bcpq->bchw", reads=("dy", "x0", "y1"), grads=(0,),
                              flops=[(1, "bcpq", OTHER)], whole=["h", "w", "p", "q"],
                              bytes=[(x.itemsize, "bcpq"), (8, "bcpq"), (x.itemsize, "bchw")])]
        return [KernelDef(spec="bcpq->bchw", reads=("dy",), grads=(0,), flops=[(1, "bcpqkl", OTHER)],
                          whole=["p", "q"], free_letters=free, out_shapes=[x.shape])]

    return forward, backward


def _reduce(kind: str):
    def forward(call: KernelCall) -> KernelDef:
        """``x`` summed (or averaged) over the letters its ``spec`` drops (``"bsh->"``: to a
        scalar).  One add per input element (and one divide per output for a mean)."""
        (x,) = call.inputs
        spec = call.param("spec") or f"{_LETTERS[:x.rank]}->"
        (term,), (out,) = parse_spec(spec)
        terms = [(1, term, OTHER)] + ([(1, out, OTHER)] if kind == "mean" else [])
        return KernelDef(spec=spec, flops=terms, reduce=[c for c in term if c not in out],
                         out_dtypes=[call.param("dtype", "fp32")])

    def backward(g: Grads) -> list[KernelDef]:
        (term,), (out,) = g.terms  # to a scalar, out is "": the gradient's equation reads it as "->bs"
        return [KernelDef(spec=f"{out}->{term}", reads=("dy",), grads=(0,), flops=[(1, term, OTHER)]
                          if kind == "mean" else [], out_shapes=None)]

    return forward, backward


def _first_token(call: KernelCall) -> KernelDef:
    """``x`` [b, s, h] -> its first token [b, h] (a ViT's class token, BERT's [CLS] for the
    pooler): a copy of b·h elements, no FLOPs."""
    (x,) = call.inputs
    if x.rank != 3:
        raise ValueError("first_token takes x [b, s, h]")
    return KernelDef(spec="bsh->bh", bytes=[(2 * x.itemsize, "bh")], whole=["s"],
                     out_shapes=[(x.shape[0], x.shape[2])])


def _first_token_backward(g: Grads) -> list[KernelDef]:
    """The gradient of the whole sequence: dy at the first token, zeros elsewhere (written once)."""
    x = g.inputs[0]
    return [KernelDef(spec="bh->bsh", reads=("dy",), grads=(0,), bytes=[(x.itemsize, "bh"), (x.itemsize, "bsh")],
                      whole=["s"])]


_maxpool, _maxpool_bwd = _pool("maxpool")
_avgpool, _avgpool_bwd = _pool("avgpool")
_sum, _sum_bwd = _reduce("sum")
_mean, _mean_bwd = _reduce("mean")

#: the kernels the core provides for model plugins to list in ``ModelSpec.kernels``
STANDARD: dict[str, KernelSpec] = {k.name: k for k in (
    KernelSpec("conv2d", _conv2d, _conv2d_backward, "conv", "2-D convolution (stride, padding, dilation), "
               "implicit GEMM: 2 FLOPs per multiply-add"),
    KernelSpec("relu", _relu, _relu_backward, "elementwise", "max(x, 0)"),
    KernelSpec("batchnorm", _batchnorm, _batchnorm_backward, "norm", "batch normalization (training), per channel"),
    KernelSpec("maxpool", _maxpool, _maxpool_bwd, "pool", "max pooling, a window or global"),
    KernelSpec("avgpool", _avgpool, _avgpool_bwd, "pool", "average pooling, a window or global"),
    KernelSpec("sum", _sum, _sum_bwd, "reduction", "a sum over some letters, to a scalar or any shape"),
    KernelSpec("mean", _mean, _mean_bwd, "reduction", "a mean over some letters, to a scalar or any shape"),
    KernelSpec("first_token", _first_token, _first_token_backward, "copy",
               "the first token of each sequence (a ViT's class token, BERT's [CLS])"),
)}
