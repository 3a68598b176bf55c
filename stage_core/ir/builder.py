"""GraphBuilder: how model plugins write a model, once, for one device, forward only.

Every method appends one op and returns its output tensor(s).  Shapes are tuples
of dim names or expressions; letters of the index equations are local to an op.

    g = GraphBuilder("gpt", dims={"b": 1, "s": 1024, "h": 768, ...})
    tok = g.input("tokens", ("b", "s"))
    wte = g.param("embed.wte", ("V", "h"))
    x = g.embedding(tok, wte)
    with g.layer(0):
        y = g.einsum("bsh,hf->bsf", x, g.param("mlp.w1", ("h", "f")), name="mlp.fc1")
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterable, Sequence

import sympy as sp

from .. import sym
from ..errors import UsageError
from . import kernels
from .graph import CacheDecl, Graph
from .ops import MATMUL, OTHER, Op, parse_spec
from .tensor import Role, Tensor


def _letters(rank: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[:rank]


#: the letter of a local-attention window in cost terms: the keys one query reads
WINDOW_LETTER = "w"


def window_letters(window: int, keys) -> dict:
    """The free letter of a local-attention kernel: w = min(window, keys)."""
    return {WINDOW_LETTER: sp.Min(sp.Integer(window), sym.expr(keys))}


def pair_terms(coeff, letters: str, kind: str, causal: bool, window: int | None) -> list[tuple]:
    """Cost terms of ``coeff`` per (query, key) pair over ``letters`` (query letter ``s``,
    key letter ``k``, the other letters their own sizes).

    Full attention: s·k pairs, halved (s·k/2) when ``causal``.  With a ``window``
    each query reads w = min(window, k) keys: s·w pairs, and when ``causal`` the
    first queries read fewer, s·w − w²/2 pairs (s²/2 again when the window covers the
    sequence), written as two terms over the window letter.
    """
    if window is None:
        return [((sp.Rational(1, 2) if causal else 1) * sp.nsimplify(coeff), letters, kind)]
    banded = letters.replace("k", WINDOW_LETTER)
    terms = [(sp.nsimplify(coeff), banded, kind)]
    if causal:
        terms.append((-sp.nsimplify(coeff) / 2, banded.replace("s", WINDOW_LETTER), kind))
    return terms


def flash_terms(vd: str, causal: bool, window: int | None, softcap) -> list[tuple]:
    """The flash kernel's cost terms: Q·Kᵀ and P·V (value dim letter ``vd``), 2 FLOPs per
    multiply-add each, and the softmax (with ``softcap``, the cap) per score."""
    per_score = kernels.SOFTMAX[0] + (kernels.SOFTCAP[0] if softcap is not None else 0)
    return [
        *pair_terms(2, "bsgrdk", MATMUL, causal, window),  # Q·K^T
        *pair_terms(2, f"bsgr{vd}k", MATMUL, causal, window),  # P·V
        *pair_terms(per_score, "bgrsk", OTHER, causal, window),
    ]


#: the most ops a model graph may have (about 4,500 GPT layers; the largest published
#: models have a few thousand): past it, building, differentiating and lowering take
#: minutes and gigabytes, so the builder stops (see stage_core.bounds)
MAX_MODEL_OPS = 50_000


#: the kernels registered for the model being built (``ModelSpec.kernels``): the host sets
#: it around ``ModelSpec.build``, so a builder made inside sees them
_KERNELS: contextvars.ContextVar[dict] = contextvars.ContextVar("stage_kernels", default={})


@contextmanager
def kernel_scope(specs: Iterable):
    """Builders made inside see the registered kernels ``specs`` (by name)."""
    token = _KERNELS.set({k.name: k for k in specs})
    try:
        yield
    finally:
        _KERNELS.reset(token)


class GraphBuilder:
    def __init__(self, name: str, dims: dict[str, int] | None = None, dtype: str = "bf16", meta=None,
                 kernels: Iterable | None = None):
        """``kernels``: registered kernels (:class:`stage_core.kernels.KernelSpec`) this
        model may call with :meth:`kernel`; by default those of the model being built
        (its ``ModelSpec.kernels``)."""
        self.graph = Graph(name=name, dims=dict(dims or {}), meta=dict(meta or {}),
                           registered=dict(_KERNELS.get()) if kernels is None else {k.name: k for k in kernels})
        self.dtype = dtype
        self._prefix: list[str] = []
        self._layer: int | None = None
        self._block: str = ""
        self._names: set[str] = set()

    # ------------------------------------------------------------------ scopes
    @contextmanager
    def scope(self, name: str):
        self._prefix.append(name)
        try:
            yield
        finally:
            self._prefix.pop()

    @contextmanager
    def layer(self, index: int, name: str | None = None):
        """Ops inside belong to transformer layer ``index`` (pipeline stages split on this)."""
        old = self._layer
        self._layer = index
        with self.scope(name or f"layers.{index}"):
            try:
                yield
            finally:
                self._layer = old

    @contextmanager
    def block(self, name: str):
        """Tag ops with a block name (``attn_core`` is what selective recompute redoes)."""
        old = self._block
        self._block = name
        try:
            yield
        finally:
            self._block = old

    def _name(self, name: str) -> str:
        full = ".".join(self._prefix + [name])
        base, k = full, 1
        while full in self._names:
            k += 1
            full = f"{base}#{k}"
        self._names.add(full)
        return full

    # ------------------------------------------------------------------ leaves
    def input(self, name: str, shape: Sequence, dtype: str = "int64", tags: Iterable[str] = ()) -> Tensor:
        t = Tensor(self._name(name), tuple(shape), dtype, Role.INPUT, frozenset(tags))
        self.graph.inputs.append(t)
        return t

    def param(self, name: str, shape: Sequence, dtype: str | None = None, tags: Iterable[str] = ()) -> Tensor:
        t = Tensor(self._name(name), tuple(shape), dtype or self.dtype, Role.PARAMETER, frozenset(tags))
        self.graph.params.append(t)
        return t

    def cache(self, x: Tensor, *, name: str, seq_dim: str = "s") -> Tensor:
        """Declare ``x`` (per-token values, e.g. an attention key after RoPE) as kept per
        request between inference steps, and return it.

        Training ignores the declaration; prefill writes ``x`` into the cache, decode
        appends it and the readers of ``x`` read the whole cache
        (:mod:`stage_core.tasks`).  ``seq_dim``: the dim of ``x`` the cache grows along.
        """
        pos = next((i for i, d in enumerate(x.shape) if getattr(d, "name", None) == seq_dim), None)
        if pos is None:
            raise ValueError(f"cache {name}: tensor {x.name} has no dim {seq_dim!r} to grow along")
        self.graph.caches.append(CacheDecl(self._name(name), x, pos))
        return x

    def state(self, x: Tensor, *, name: str) -> Tensor:
        """Declare ``x`` as a recurrent state kept per request between inference steps (a
        Mamba layer's SSM state after its last token): a fixed size, whatever the context;
        prefill writes it, each decode step reads and rewrites it (:mod:`stage_core.tasks`)."""
        self.graph.caches.append(CacheDecl(self._name(name), x, None))
        return x

    # ------------------------------------------------------------------ core op
    def op(
        self,
        kind: str,
        spec: str,
        inputs: Sequence[Tensor],
        out_shapes: Sequence[Sequence] | None = None,
        *,
        name: str,
        fn: str = "",
        flop_terms=(),
        byte_terms=(),
        out_dtypes: Sequence[str] | None = None,
        out_tags: Sequence[Iterable[str]] | None = None,
        linear_reduce: Iterable[str] = (),
        whole: Iterable[str] = (),
        partial_ok: bool = False,
        attrs: dict | None = None,
        free_letters: dict | None = None,
    ) -> tuple[Tensor, ...]:
        if len(self.graph.ops) >= MAX_MODEL_OPS:
            where = f" (at layer {self._layer})" if self._layer is not None else ""
            raise UsageError(f"model {self.graph.name}: its graph passes {MAX_MODEL_OPS:,} ops{where}, more than "
                             f"STAGE builds; give fewer layers")
        ins, outs = parse_spec(spec)
        if out_shapes is None:
            sizes: dict[str, object] = {}
            for term, t in zip(ins, inputs):
                for c, d in zip(term, t.shape):
                    sizes.setdefault(c, d)
            out_shapes = [tuple(sizes[c] for c in term) for term in outs]
        out_dtypes = list(out_dtypes or [self.dtype] * len(outs))
        out_tags = list(out_tags or [()] * len(outs))
        full = self._name(name)
        outputs = tuple(
            Tensor(full if len(outs) == 1 else f"{full}:{i}", tuple(shape), dt, Role.ACTIVATION, frozenset(tg))
            for i, (shape, dt, tg) in enumerate(zip(out_shapes, out_dtypes, out_tags))
        )
        op = Op(
            name=full,
            kind=kind,
            fn=fn,
            inputs=tuple(inputs),
            outputs=outputs,
            spec=spec,
            flop_terms=tuple(flop_terms),
            byte_terms=tuple(byte_terms),
            linear_reduce=frozenset(linear_reduce),
            whole=frozenset(whole),
            partial_ok=partial_ok,
            layer=self._layer,
            block=self._block,
            attrs=dict(attrs or {}),
            free_letters=dict(free_letters or {}),
        )
        self.graph.ops.append(op)
        return outputs

    # ------------------------------------------------------------------ einsum
    def einsum(
        self,
        spec: str,
        a: Tensor,
        b: Tensor,
        *,
        name: str,
        bias: Tensor | None = None,
        flops_scale=1,
        out_dtype: str | None = None,
        tags: Iterable[str] = (),
    ) -> Tensor:
        """A two-operand einsum (optionally with a bias added in the same kernel).

        Every letter of each operand must appear in the other operand or in the
        output, so that each VJP is itself an einsum.  FLOPs: 2 per multiply-add
        over the whole index space when some letter is contracted (a matmul),
        otherwise 1 per product.  ``flops_scale`` scales that count (causal
        attention that skips the masked half uses 1/2).
        """
        (ta, tb), (to,) = parse_spec(spec)
        for term, other in ((ta, tb), (tb, ta)):
            for c in term:
                if c not in other and c not in to:
                    raise ValueError(f"einsum {spec!r}: index {c!r} is summed inside one operand; reduce it first")
        space = "".join(dict.fromkeys(ta + tb))
        contracted = [c for c in space if c not in to]
        coeff = sp.nsimplify(flops_scale) * (2 if contracted else 1)
        terms = [(coeff, space, MATMUL if contracted else OTHER)]
        inputs = [a, b]
        full_spec = spec
        if bias is not None:
            bias_term = to[len(to) - bias.rank :]  # a bias covers the trailing output dims
            full_spec = f"{ta},{tb},{bias_term}->{to}"
            inputs.append(bias)
            terms.append((1, to, OTHER))
        (out,) = self.op(
            "einsum",
            full_spec,
            inputs,
            name=name,
            flop_terms=terms,
            linear_reduce=contracted,
            out_dtypes=[out_dtype or self.dtype],
            out_tags=[tags],
            attrs={"flops_scale": sp.nsimplify(flops_scale), "has_bias": bias is not None, "einsum": spec},
        )
        return out

    # ------------------------------------------------------------------ elementwise
    def elementwise(
        self,
        fn: str,
        *xs: Tensor,
        name: str | None = None,
        spec: str | None = None,
        tags: Iterable[str] = (),
        out_dtype: str | None = None,
    ) -> Tensor:
        """An elementwise kernel from :data:`kernels.ELEMENTWISE` (``gelu``, ``add``...)."""
        if fn not in kernels.ELEMENTWISE:
            raise ValueError(f"unknown elementwise kernel {fn!r}; known: {sorted(kernels.ELEMENTWISE)}")
        if spec is None:
            letters = _letters(xs[0].rank)
            spec = ",".join(letters for _ in xs) + "->" + letters
        out_term = parse_spec(spec)[1][0]
        (out,) = self.op(
            "elementwise",
            spec,
            xs,
            name=name or fn,
            fn=fn,
            flop_terms=[(kernels.ELEMENTWISE[fn][0], out_term, OTHER)],
            partial_ok=fn == "add",
            out_dtypes=[out_dtype or xs[0].dtype],
            out_tags=[tags],
        )
        return out

    def add(self, x: Tensor, y: Tensor, *, name: str = "add", tags: Iterable[str] = ()) -> Tensor:
        return self.elementwise("add", x, y, name=name, tags=tags)

    def gelu(self, x: Tensor, *, name: str = "gelu") -> Tensor:
        return self.elementwise("gelu", x, name=name)

    def bias_gelu(self, x: Tensor, bias: Tensor, *, name: str = "bias_gelu") -> Tensor:
        letters = _letters(x.rank)
        return self.elementwise("bias_gelu", x, bias, name=name, spec=f"{letters},{letters[-1]}->{letters}")

    def swiglu(self, gate: Tensor, up: Tensor, *, name: str = "swiglu") -> Tensor:
        return self.elementwise("swiglu", gate, up, name=name)

    def softcap(self, x: Tensor, cap, *, name: str = "softcap") -> Tensor:
        """``cap·tanh(x/cap)`` (Gemma 2's final logit soft-capping)."""
        out = self.elementwise("softcap", x, name=name)
        self.graph.ops[-1].attrs["softcap"] = sp.nsimplify(cap)
        return out

    def rope(self, x: Tensor, *, name: str = "rope") -> Tensor:
        return self.elementwise("rope", x, name=name)

    def dropout(self, x: Tensor, *, name: str = "dropout", tags: Iterable[str] = ()) -> Tensor:
        """Dropout; its 1-byte mask is a second output that backward keeps."""
        letters = _letters(x.rank)
        out, _mask = self.op(
            "elementwise",
            f"{letters}->{letters},{letters}",
            [x],
            name=name,
            fn="dropout",
            flop_terms=[(kernels.ELEMENTWISE["dropout"][0], letters, OTHER)],
            out_dtypes=[x.dtype, "u8"],
            out_tags=[tags, ("mask",)],
        )
        return out

    def dropout_add(
        self, x: Tensor, residual: Tensor, bias: Tensor | None = None, *, name: str = "dropout_add",
        tags: Iterable[str] = (),
    ) -> Tensor:
        """``residual + dropout(x + bias)`` in one kernel (Megatron's bias-dropout-add)."""
        letters = _letters(x.rank)
        fn = "bias_dropout_add" if bias is not None else "dropout_add"
        ins = [x] + ([bias] if bias is not None else []) + [residual]
        terms = [letters] + ([letters[-1]] if bias is not None else []) + [letters]
        out, _mask = self.op(
            "elementwise",
            ",".join(terms) + f"->{letters},{letters}",
            ins,
            name=name,
            fn=fn,
            flop_terms=[(kernels.ELEMENTWISE[fn][0], letters, OTHER)],
            out_dtypes=[x.dtype, "u8"],
            out_tags=[tags, ("mask",)],
        )
        return out

    # ------------------------------------------------------------------ reductions and norms
    def softmax(self, x: Tensor, over: int = -1, *, name: str = "softmax") -> Tensor:
        letters = _letters(x.rank)
        axis = letters[over]
        (out,) = self.op(
            "softmax",
            f"{letters}->{letters}",
            [x],
            name=name,
            flop_terms=[(kernels.SOFTMAX[0], letters, OTHER)],
            whole=[axis],
            attrs={"over": axis},
        )
        return out

    def norm(
        self, kind: str, x: Tensor, weight: Tensor, bias: Tensor | None = None, *, name: str | None = None,
        tags: Iterable[str] = (), over: int = 1, gate: Tensor | None = None, partial_sums: bool = False,
    ) -> Tensor:
        """LayerNorm or RMSNorm of ``x`` over its last ``over`` dims (default the last one).

        ``weight`` (and ``bias``) cover the trailing ``weight.rank`` dims of ``x``: at least
        the normalized ones, more for a weight per group (Mamba-2's grouped norm).
        ``gate`` (kind ``gated_rmsnorm``, shaped like ``x``): ``rmsnorm(x * silu(gate))`` in
        one kernel, as Mamba-2's gated RMSNorm.  ``partial_sums``: when a normalized dim
        is sharded, the kernel all-reduces each row's fp32 statistics (sum of squares; and
        the sum for layernorm) over that axis instead of gathering the dim (a norm over
        all heads under tensor parallel, OLMo 2's q/k norm).
        """
        if kind not in kernels.NORM:
            raise ValueError(f"unknown norm {kind!r}; known: {sorted(kernels.NORM)}")
        if (kind == "gated_rmsnorm") != (gate is not None):
            raise ValueError(f"norm {name or kind}: a gate goes with kind 'gated_rmsnorm' and only with it")
        letters = _letters(x.rank)
        normed = letters[x.rank - over:]
        wterm = letters[x.rank - weight.rank:]
        if not 1 <= over <= weight.rank <= x.rank:
            raise ValueError(f"norm {name or kind}: over={over} and a weight of rank {weight.rank} do not fit "
                             f"a tensor of rank {x.rank}")
        ins = [x] + ([gate] if gate is not None else []) + [weight] + ([bias] if bias is not None else [])
        terms = [letters] * (2 if gate is not None else 1) + [wterm] * (2 if bias is not None else 1)
        attrs: dict = {"over": normed}
        if partial_sums:
            stats = 4 * (2 if kind == "layernorm" else 1)  # fp32 per row
            rows = "".join(c for c in letters if c not in normed)
            attrs["sharded_whole"] = {c: (("all_reduce", rows, stats),) for c in normed}
        (out,) = self.op(
            "norm",
            ",".join(terms) + f"->{letters}",
            ins,
            name=name or kind,
            fn=kind,
            flop_terms=[(kernels.NORM[kind][0], letters, OTHER)],
            whole=normed,
            out_tags=[tags],
            attrs=attrs,
        )
        return out

    def reduce_sum(self, x: Tensor, spec: str, *, name: str = "sum") -> Tensor:
        ins, outs = parse_spec(spec)
        reduced = [c for c in ins[0] if c not in outs[0]]
        (out,) = self.op(
            "reduction",
            spec,
            [x],
            name=name,
            fn="sum",
            flop_terms=[(kernels.REDUCTION_SUM, ins[0], OTHER)],
            linear_reduce=reduced,
        )
        return out

    # ------------------------------------------------------------------ embedding and loss
    def embedding(self, tokens: Tensor, table: Tensor, positions: Tensor | None = None, *, name: str = "embedding",
                  tags: Iterable[str] = ()) -> Tensor:
        """Look up rows of ``table`` [V, h] for ``tokens`` [b, s]: a gather, no FLOPs.

        With ``positions`` [P, h] (a learned position table of P >= s rows) the first s
        rows are added in the same kernel (one FLOP per output element).  Bytes: the
        token ids, the rows read and the output written; not the whole tables.
        """
        item = table.itemsize
        terms = [(tokens.itemsize, "bs"), (item, "bsh"), (item, "bsh")]
        flops = []
        spec = "bs,vh->bsh"
        ins = [tokens, table]
        if positions is not None:
            spec = "bs,vh,ph->bsh"
            ins.append(positions)
            terms.append((positions.itemsize, "sh"))
            flops.append((1, "bsh", OTHER))
        (out,) = self.op(
            "embedding",
            spec,
            ins,
            name=name,
            flop_terms=flops,
            byte_terms=terms,
            linear_reduce=["v"],
            out_dtypes=[table.dtype],
            out_tags=[tags],
        )
        return out

    def cross_entropy(self, logits: Tensor, labels: Tensor, *, name: str = "cross_entropy") -> Tensor:
        """Per-token loss (fp32) of ``logits`` [b, s, V] against ``labels`` [b, s] (or of a
        classifier's ``logits`` [b, V] against ``labels`` [b]: one loss per sample).

        The kernel also writes the softmax of the logits (kept for backward, as
        Megatron's cross-entropy keeps it), its second output.

        Vocabulary-parallel: when V is sharded over a mesh axis, the kernel
        all-reduces three fp32 [b, s] tensors over that axis (the max logit, the sum
        of exponentials and the target logit, as Megatron's vocab-parallel
        cross-entropy does) instead of gathering the logits.
        """
        tok = self._token_letters(logits.rank)
        if labels.rank != len(tok):
            raise ValueError(f"cross_entropy {name}: labels {labels.name} of rank {labels.rank} for logits of rank "
                             f"{logits.rank}; expected rank {len(tok)}")
        loss, _probs = self.op(
            "fused",
            f"{tok}v,{tok}->{tok},{tok}v",
            [logits, labels],
            name=name,
            fn="cross_entropy",
            flop_terms=[(kernels.CROSS_ENTROPY[0], f"{tok}v", OTHER)],
            whole=["v"],
            out_dtypes=["fp32", logits.dtype],
            out_tags=[(), ("softmax",)],
            attrs={"sharded_whole": {"v": (("all_reduce", tok, 4),) * 3}},
        )
        return loss

    def flash_attention(self, q: Tensor, k: Tensor, v: Tensor, *, causal_flops: bool = False,
                        causal: bool = True, name: str = "flash_attention", separate_value_dim: bool | None = None,
                        window: int | None = None, softcap=None, value_in_key: bool = False) -> Tensor:
        """Fused attention (FlashAttention): q [b,s,g,r,d], k and v [b,s,g,d] -> [b,s,g,r,d].

        Forward: Q·Kᵀ and P·V, 2 FLOPs per multiply-add each (halved with
        ``causal_flops``), softmax on the scores; no s×s tensor is kept, only the
        fp32 log-sum-exp per query row.  Keys use their own letter (k) so the
        score space is b·g·r·s·k.

        With a value head dim of its own (MLA: q and k over dn+dr, v over dv), v is
        [b,s,g,dv] and the output [b,s,g,r,dv]; the value dim is the letter ``v``
        and P·V is counted over it.  ``separate_value_dim=None`` turns this on
        exactly when v's last dim differs from k's; otherwise nothing changes.

        The kernel can stream its keys and values (letter ``k``) around a ring of ranks
        (``attrs["ring_letter"]``; not with a window): context parallel's ring attention.

        ``window`` (sliding-window, local attention): each query reads only the
        ``window`` keys before it, so the score space counts w = min(window, keys)
        keys per query, not all of them (:func:`pair_terms`).  ``softcap`` (Gemma 2):
        the scores pass through ``softcap·tanh(x/softcap)`` before the softmax,
        :data:`kernels.SOFTCAP` FLOPs per score.

        ``value_in_key``: v is the leading part of k (MLA's absorbed form reads one latent
        per key as both), so the kernel reads it once: v's bytes are not counted again.

        ``causal``: the mask (a decoder's; ``False`` for an encoder's bidirectional
        attention).  It does not change the FLOPs counted (``causal_flops`` does); it
        tells a compute model that the kernel skips the masked half of the scores.
        """
        scale = sp.Rational(1, 2) if causal_flops else sp.Integer(1)
        if separate_value_dim is None:
            separate_value_dim = v.shape[-1] != k.shape[-1] and sp.expand(v.shape[-1] - k.shape[-1]) != 0
        vd = "v" if separate_value_dim else "d"
        terms = flash_terms(vd, causal_flops, window, softcap)
        attrs = {"flops_scale": scale, "causal_flops": bool(causal_flops), "causal": bool(causal)}
        if window is None:
            # ring attention (context parallel, TransformerEngine's p2p) streams the keys
            # and values around the ring and merges the blocks with the log-sum-exp
            attrs["ring_letter"] = "k"
        if separate_value_dim:
            attrs["separate_value_dim"] = True
        if softcap is not None:
            attrs["softcap"] = sp.nsimplify(softcap)
        free = {}
        if window is not None:
            if not isinstance(window, int) or isinstance(window, bool) or window < 1:
                raise ValueError(f"flash attention {name}: window={window!r} must be a positive integer")
            attrs["window"] = window
            free = window_letters(window, k.shape[1])
        byte_terms = ()
        if value_in_key:  # q, k, the output and the fp32 log-sum-exp; v is read with k
            attrs["value_in_key"] = True
            byte_terms = ((q.itemsize, "bsgrd"), (k.itemsize, "bkgd"), (q.itemsize, f"bsgr{vd}"), (4, "bgrs"))
        o, lse = self.op(
            "fused",
            f"bsgrd,bkgd,bkg{vd}->bsgr{vd},bgrs",
            [q, k, v],
            name=name,
            fn="flash_attention",
            flop_terms=terms,
            whole=["k"],
            out_dtypes=[q.dtype, "fp32"],
            attrs=attrs,
            free_letters=free,
            byte_terms=byte_terms,
        )
        return o

    # ------------------------------------------------------------------ state-space models
    def causal_conv1d(self, x: Tensor, weight: Tensor, bias: Tensor, *, name: str = "conv1d") -> tuple[Tensor, Tensor]:
        """Depthwise causal conv1d with bias and SiLU fused (Mamba's ``causal_conv1d_fn``).

        ``x`` [b, s, groups..., c] -> the same shape; ``weight`` [groups..., c, k] (k taps),
        ``bias`` [groups..., c].  Each output element is the SiLU of its channel's last k
        inputs along s times the taps, plus the bias: :data:`kernels.CONV_PER_TAP` per tap
        and :data:`kernels.CONV_BIAS_SILU` per element.  It needs the whole sequence (s is
        gathered first where it is sharded); backward keeps only the input and recomputes.
        Returns the output and the conv state, the last k − 1 inputs of every channel
        [b, groups..., c, k−1] (what an inference step keeps; no bytes of its own here).
        """
        chans = "cdefghij"[: x.rank - 2]  # the channel letters after b and s
        tokens = "bs" + chans
        if weight.rank != len(chans) + 1 or bias.rank != len(chans):
            raise ValueError(f"causal_conv1d {name}: weight must be [{', '.join(chans)}, taps] and bias "
                             f"[{', '.join(chans)}] for an input of rank {x.rank}")
        taps = self._constant(weight.shape[-1], "taps")
        state_shape = (x.shape[0], *x.shape[2:], weight.shape[-1] - 1)
        out, state = self.op(
            "fused",
            f"{tokens},{chans}k,{chans}->{tokens},b{chans}j",
            [x, weight, bias],
            [x.shape, state_shape],
            name=name,
            fn="causal_conv1d",
            flop_terms=[(kernels.CONV_PER_TAP[0] * taps + kernels.CONV_BIAS_SILU[0], tokens, OTHER)],
            byte_terms=[(x.itemsize, tokens), (weight.itemsize * taps + bias.itemsize, chans), (x.itemsize, tokens)],
            linear_reduce=["k"],
            whole=["s"],
            out_dtypes=[x.dtype, x.dtype],
            attrs={"taps": taps},
        )
        return out, state

    def ssd_scan(self, x: Tensor, dt: Tensor, a_log: Tensor, b: Tensor, c: Tensor, d: Tensor, dt_bias: Tensor, *,
                 chunk, name: str = "ssd") -> tuple[Tensor, Tensor]:
        """Mamba-2's selective state-space scan, the SSD chunked algorithm (Dao & Gu 2024, section 6)
        as one declared kernel (``mamba_chunk_scan_combined``).

        Shapes, with g groups (B and C shared by their r heads), r heads per group, p head
        dim, n state size: ``x`` [b,s,g,r,p], ``dt`` [b,s,g,r], ``a_log``, ``d`` and
        ``dt_bias`` [g,r], ``b`` and ``c`` [b,s,g,n] -> y [b,s,g,r,p]; a second fp32 output
        [b,s,g,r] is the chunk-cumulative decay dA_cumsum that backward reads; a third the
        state after the last token [b,g,r,p,n] (what inference keeps).  Returns y and the
        final state.

        FLOPs per token, chunk length Q = ``chunk``, G = g groups, H = g·r heads, from the
        paper's four steps (BMM(B, M, N, K) = 2·B·M·N·K): the diagonal blocks C·Bᵀ per group
        2·Q·n·G and their product with x per head 2·Q·p·H; the chunk states Bᵀ·x 2·n·p·H;
        the outputs from the states C·h 2·n·p·H (matmuls); the state passing between
        chunks 2·n·p·H/Q and the elementwise work of :data:`kernels.SSD_DT`,
        :data:`~kernels.SSD_MASK`, :data:`~kernels.SSD_OUT` (other).  Bytes: the HBM
        traffic of the kernel's five passes (chunk_cumsum, chunk_state, state_passing,
        bmm_chunk, chunk_scan): x read twice, y written, dt read and the fp32 dt and
        dA_cumsum written once and read twice, B and C read twice each, C·Bᵀ (Q values per
        token and group) written and read, and the fp32 chunk states (n·p per head and
        chunk) written, read, rewritten and read.  It needs the whole sequence.
        """
        q = self._constant(chunk, "chunk")
        item = x.itemsize
        terms = [
            (2 * q, "bsgn", MATMUL),  # C·Bᵀ inside each chunk, per group
            (2 * q, "bsgrp", MATMUL),  # (L ∘ C·Bᵀ)·x, per head
            (2, "bsgrpn", MATMUL),  # chunk states Bᵀ·x
            (2, "bsgrpn", MATMUL),  # outputs from the states C·h
            (kernels.SSD_PASS[0] / q, "bsgrpn", OTHER),  # state passing, once per chunk
            (kernels.SSD_DT[0], "bsgr", OTHER),
            (kernels.SSD_MASK[0] * q, "bsgr", OTHER),
            (kernels.SSD_OUT[0], "bsgrp", OTHER),
        ]
        bytes_ = [(3 * item, "bsgrp"), (dt.itemsize + 6 * 4, "bsgr"), (4 * b.itemsize, "bsgn"),
                  (2 * b.itemsize * q, "bsg"), (16 / q, "bsgrpn")]
        y, _cumsum, state = self.op(
            "fused",
            "bsgrp,bsgr,gr,bsgn,bsgn,gr,gr->bsgrp,bsgr,bgrpn",
            [x, dt, a_log, b, c, d, dt_bias],
            name=name,
            fn="ssd_scan",
            flop_terms=terms,
            byte_terms=bytes_,
            whole=["s"],
            out_dtypes=[x.dtype, "fp32", x.dtype],
            attrs={"chunk": q},
        )
        return y, state

    # ------------------------------------------------------------------ registered kernels
    def kernel(self, kernel: str, *inputs: Tensor, name: str | None = None, tags: Iterable[str] = (),
               **params) -> Tensor | tuple[Tensor, ...]:
        """A call of the registered kernel ``kernel`` (listed in the model's
        ``ModelSpec.kernels``; see :mod:`stage_core.kernels`) on ``inputs``, with keyword
        ``params`` (a convolution's ``stride``...).  Returns its output, or a tuple when it
        has several; ``tags`` tag the first."""
        from ..kernels import KernelCall, KernelError, check_def

        spec = self.graph.registered.get(kernel)
        if spec is None:
            known = ", ".join(sorted(self.graph.registered)) or "none"
            raise KernelError(f"kernel {kernel!r} is not registered for model {self.graph.name} (registered: "
                              f"{known}); list its KernelSpec in the model's ModelSpec.kernels")
        call = KernelCall(tuple(inputs), dict(params), dict(self.graph.dims))
        try:
            d = spec.forward(call)
        except (ValueError, TypeError, KeyError) as exc:
            if isinstance(exc, KernelError):
                raise
            raise KernelError(f"kernel {kernel} ({name or kernel}): {exc}") from None
        ins, outs = check_def(d, kernel, len(inputs))
        tags_ = [tuple(tags)] + [()] * (len(outs) - 1)
        outputs = self.op(
            spec.kind, d.spec, list(inputs), d.out_shapes, name=name or kernel, fn=spec.name,
            flop_terms=list(d.flops), byte_terms=list(d.bytes or ()), out_dtypes=d.out_dtypes, out_tags=tags_,
            linear_reduce=d.reduce, whole=d.whole, partial_ok=d.partial_ok,
            attrs={**d.attrs, "registered": spec.name, "params": dict(params)}, free_letters=dict(d.free_letters),
        )
        return outputs[0] if len(outputs) == 1 else outputs

    # ------------------------------------------------------------------ views
    def split(self, x: Tensor, spec: str, out_shapes: Sequence[Sequence], *, name: str = "split") -> tuple[Tensor, ...]:
        """A view that splits one tensor into several (no kernel, no cost)."""
        return self.op("view", spec, [x], out_shapes, name=name, fn="split", out_dtypes=[x.dtype] * len(out_shapes))

    def view(self, x: Tensor, spec: str, out_shape: Sequence, *, name: str = "view") -> Tensor:
        (out,) = self.op("view", spec, [x], [out_shape], name=name, fn="reshape", out_dtypes=[x.dtype])
        return out

    # ------------------------------------------------------------------ finish
    def finish(self, loss: Tensor) -> Graph:
        self.graph.loss = loss
        self.graph.check_order()
        return self.graph

    # ------------------------------------------------------------------ mixture of experts
    # (appended for MoE models; see kernels.ROUTER_*, kernels.COMBINE)

    @staticmethod
    def _token_letters(rank: int) -> str:
        """Letters for the token dims of a [tokens..., x] tensor (``bs`` for [b, s, x])."""
        letters = "bsijlmnopqtuwxyz"
        if rank - 1 > len(letters):
            raise ValueError(f"too many token dims ({rank - 1})")
        return letters[: rank - 1]

    def _constant(self, value, what: str):
        """``value`` as a number: an int, or an expression of dims bound in ``graph.dims``.

        Kernel FLOP and byte coefficients must be numbers (lowering multiplies them by
        local letter sizes); shapes may stay symbolic.
        """
        e = sym.expr(value)
        if e.free_symbols:
            e = e.xreplace({x: sp.Integer(self.graph.dims[x.name]) for x in e.free_symbols
                            if x.name in self.graph.dims})
        if e.free_symbols or not e.is_Number:
            raise ValueError(f"{what}={value!r} must be a number or an expression of dims in graph.dims")
        return e

    def router(
        self,
        logits: Tensor,
        *,
        k,
        score: str = "softmax",
        normalize: bool = True,
        scale=1,
        selection_bias: bool = False,
        name: str = "router",
    ) -> Tensor:
        """Fused MoE router: scores, top-k, weights. ``logits`` [tokens..., E] -> [tokens..., E].

        ``score`` is ``"softmax"`` (Mixtral, Qwen-MoE) or ``"sigmoid"`` (DeepSeek-V3)
        over the E experts; the top ``k`` scores per token are kept (``normalize``:
        rescaled to sum to one; ``scale``: then multiplied by a constant;
        ``selection_bias``: a per-expert bias is added to the scores for the
        choice only).  The output is the dense fp32 routing weights with k
        nonzeros per token; a second fp32 output keeps all scores for backward.
        The expert dim is the letter ``e``.  FLOPs: :data:`kernels.ROUTER_SCORE`,
        :data:`~kernels.ROUTER_TOPK` per score, :data:`~kernels.ROUTER_TOPK_NORM`
        and :data:`~kernels.ROUTER_SCALE` per selected weight.
        """
        if score not in kernels.ROUTER_SCORE:
            raise ValueError(f"unknown router score {score!r}; known: {sorted(kernels.ROUTER_SCORE)}")
        k = self._constant(k, "k")
        scale = sp.nsimplify(scale, rational=True)
        tok = self._token_letters(logits.rank)
        per_score = kernels.ROUTER_SCORE[score][0] + kernels.ROUTER_TOPK[0]
        if selection_bias:
            per_score += kernels.ROUTER_SELECTION_BIAS[0]
        terms = [(per_score, tok + "e", OTHER)]
        if normalize:
            terms.append((kernels.ROUTER_TOPK_NORM[0] * k, tok, OTHER))
        if scale != 1:
            terms.append((kernels.ROUTER_SCALE[0] * k, tok, OTHER))
        weights, _scores = self.op(
            "fused",
            f"{tok}e->{tok}e,{tok}e",
            [logits],
            name=name,
            fn="moe_router",
            flop_terms=terms,
            whole=["e"],
            out_dtypes=["fp32", "fp32"],
            out_tags=[("routing_weights",), ("router_scores",)],
            attrs={"moe": "router", "token_letters": tok, "expert_letter": "e", "experts_per_token": k,
                   "score": score, "normalize": bool(normalize), "scale": scale,
                   "selection_bias": bool(selection_bias)},
        )
        return weights

    def dispatch(self, x: Tensor, weights: Tensor, *, k, capacity_factor=None, name: str = "dispatch",
                 tags: Iterable[str] = ()) -> Tensor:
        """Copy token rows to their experts' slots: ``x`` [tokens..., h] -> [E, c, h].

        ``weights`` [tokens..., E] (from :meth:`router`) says which k experts each
        token goes to.  Each expert has c slots, c = tokens·k·cf/E with cf the
        ``capacity_factor`` (``None``: dropless, cf = 1, the uniform-routing
        average); c is an exact expression of the token dims, not always whole
        (lowering keeps E·c whole and rounds a capacity up per rank).  Letters: tokens as
        :meth:`_token_letters` (``bs``), ``e`` experts, ``c`` slots, ``h`` the row.
        ``attrs`` record how token letters map to the slot letter, so expert
        parallel can turn the token→expert regrouping into an all-to-all.

        A copy: 0 FLOPs.  Bytes: the k rows read per token, the E·c rows written,
        and the k int32 expert indices per token.
        """
        k_expr = sym.expr(k)
        k = self._constant(k, "k")
        cf = sp.Integer(1) if capacity_factor is None else sp.nsimplify(capacity_factor, rational=True)
        if cf <= 0:
            raise ValueError(f"dispatch {name}: capacity_factor={capacity_factor!r} must be positive")
        tok = self._token_letters(x.rank)
        experts = weights.shape[-1]
        capacity = sym.product(x.shape[:-1]) * k_expr * cf / experts
        item = x.itemsize
        (out,) = self.op(
            "fused",
            f"{tok}h,{tok}e->ech",
            [x, weights],
            [(experts, capacity, x.shape[-1])],
            name=name,
            fn="moe_dispatch",
            byte_terms=[(k * item, tok + "h"), (item, "ech"), (4 * k, tok)],
            out_dtypes=[x.dtype],
            out_tags=[tags],
            attrs={"moe": "dispatch", "token_letters": tok, "slot_letter": "c", "expert_letter": "e",
                   "experts_per_token": k, "capacity_factor": cf, "capacity": capacity,
                   "dropless": capacity_factor is None},
        )
        return out

    def combine(self, expert_out: Tensor, weights: Tensor, *, k, name: str = "combine",
                tags: Iterable[str] = ()) -> Tensor:
        """Weighted sum of each token's k expert outputs: [E, c, h] -> [tokens..., h].

        The inverse regrouping of :meth:`dispatch` (same letters and ``attrs``),
        scaled by the routing ``weights`` [tokens..., E].  FLOPs:
        :data:`kernels.COMBINE` per element of the k·tokens·h rows combined.
        Bytes: those rows read, the k weights and int32 indices per token read,
        the output written.
        """
        k = self._constant(k, "k")
        tok = self._token_letters(weights.rank)
        item = expert_out.itemsize
        (out,) = self.op(
            "fused",
            f"ech,{tok}e->{tok}h",
            [expert_out, weights],
            name=name,
            fn="moe_combine",
            flop_terms=[(kernels.COMBINE[0] * k, tok + "h", OTHER)],
            byte_terms=[(k * item, tok + "h"), (k * (weights.itemsize + 4), tok), (item, tok + "h")],
            out_dtypes=[expert_out.dtype],
            out_tags=[tags],
            attrs={"moe": "combine", "token_letters": tok, "slot_letter": "c", "expert_letter": "e",
                   "experts_per_token": k},
        )
        return out

    def concat(self, xs: Sequence[Tensor], spec: str, out_shape: Sequence, *, name: str = "concat") -> Tensor:
        """A view joining tensors along one dim (no kernel, no cost), e.g. ``"bsan,bsap->bsaz"``.

        The joined dim is the one output letter no input has; each input has
        exactly one letter the output lacks (its part of the joined dim).  An
        input may lack other output letters: it is broadcast along them (MLA's
        shared rope key joins every head), and its gradient is summed over them.
        """
        ins, (to,) = parse_spec(spec)
        joined = [c for c in to if not any(c in term for term in ins)]
        if len(joined) != 1:
            raise ValueError(f"concat {spec!r}: exactly one output letter must be new, got {joined}")
        parts = []
        for term in ins:
            own = [c for c in term if c not in to]
            if len(own) != 1:
                raise ValueError(f"concat {spec!r}: input {term!r} must have exactly one letter of its own")
            parts.append(own[0])
        joined_size = sym.expr(tuple(out_shape)[to.index(joined[0])])
        total = sum((x.shape[term.index(p)] for x, term, p in zip(xs, ins, parts)), sp.Integer(0))
        if sp.expand(total - joined_size) != 0:
            raise ValueError(f"concat {spec!r}: the parts sum to {total}, the joined dim is {joined_size}")
        (out,) = self.op("view", spec, list(xs), [out_shape], name=name, fn="concat",
                         out_dtypes=[xs[0].dtype], attrs={"joined_letter": joined[0], "part_letters": parts})
        return out
