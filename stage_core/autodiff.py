"""Reverse-mode autodiff on the symbolic IR: forward graph -> training graph.

Backward ops come from one VJP rule per op kind (and kernel name); an einsum's
VJP is two einsums read off its equation.  Each rule also records, on the forward
op, the tensors its backward reads (``op.saved``): activation memory is computed
from exactly these.  The optimizer step (Adam, fp32 master weights, momentum and
variance) closes the graph.  Nothing here knows any model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import sympy as sp

from . import sym
from .ir import kernels
from .ir.builder import pair_terms
from .ir.graph import Graph
from .ir.ops import BACKWARD, MATMUL, OPTIMIZER, OTHER, Op, parse_spec
from .ir.tensor import Role, Tensor

FLOAT_DTYPES = {"fp32", "bf16", "fp16", "fp8"}


@dataclass(frozen=True)
class OptimizerConfig:
    """Adam in mixed precision: fp32 master weights, momentum and variance."""

    state_dtype: str = "fp32"
    master_weights: bool = True


class _Emitter:
    """Creates backward ops attached to one forward op."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.fwd: Op | None = None
        self._n = 0

    def op(self, kind, spec, inputs, grads_of, *, fn="", flop_terms=(), byte_terms=(), linear_reduce=(),
           whole=(), partial_ok=False, attrs=None, suffix="bwd", out_dtypes=None,
           free_letters=None) -> tuple[Tensor, ...]:
        fwd = self.fwd
        ins, outs = parse_spec(spec)
        sizes = {}
        for term, t in zip(ins, inputs):
            for c, d in zip(term, t.shape):
                sizes.setdefault(c, d)
        outputs = []
        for i, (term, of) in enumerate(zip(outs, grads_of)):
            shape = tuple(of.shape) if of is not None else tuple(sizes[c] for c in term)
            dtype = (out_dtypes[i] if out_dtypes else None) or (of.dtype if of is not None else inputs[0].dtype)
            name = f"{of.name}.grad" if of is not None else f"{fwd.name}.{suffix}:{i}"
            outputs.append(Tensor(name, shape, dtype, Role.GRADIENT, grad_of=of))
        op = Op(
            name=f"{fwd.name}.{suffix}",
            kind=kind,
            fn=fn,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            spec=spec,
            flop_terms=tuple(flop_terms),
            byte_terms=tuple(byte_terms),
            linear_reduce=frozenset(linear_reduce),
            whole=frozenset(whole),
            partial_ok=partial_ok,
            phase=BACKWARD,
            layer=fwd.layer,
            block=fwd.block,
            attrs=dict(attrs or {}),
            forward_op=fwd,
            free_letters=dict(free_letters or {}),
        )
        self.graph.ops.append(op)
        return tuple(outputs)

    def reduce_to(self, g: Tensor, g_term: str, target: Tensor, t_term: str) -> Tensor:
        """Sum ``g`` over the letters ``target`` lacks (the gradient of a broadcast)."""
        if g_term == t_term:
            return g
        reduced = [c for c in g_term if c not in t_term]
        (out,) = self.op(
            "reduction", f"{g_term}->{t_term}", [g], [target], fn="sum",
            flop_terms=[(kernels.REDUCTION_SUM, g_term, OTHER)], linear_reduce=reduced,
            suffix=f"bwd.reduce.{target.name.rsplit('.', 1)[-1]}",
        )
        return out


# --------------------------------------------------------------------------- VJP rules
# A rule gets (emitter, op, out_grads, needs) and returns one gradient (or None) per
# input; it sets op.saved to the forward tensors its backward reads.

Rule = Callable[[_Emitter, Op, Sequence[Tensor | None], Sequence[bool]], list[Tensor | None]]
RULES: dict[tuple[str, str], Rule] = {}


def vjp(kind: str, *fns: str):
    def deco(f):
        for fn in fns or ("",):
            RULES[(kind, fn)] = f
        return f

    return deco


@vjp("einsum")
def _einsum(e: _Emitter, op: Op, gs, needs):
    ins, (to,) = parse_spec(op.spec)
    ta, tb = ins[0], ins[1]
    a, b = op.inputs[0], op.inputs[1]
    (g,) = gs
    scale = op.attrs.get("flops_scale", 1)
    space = "".join(dict.fromkeys(ta + tb))
    grads: list[Tensor | None] = [None] * len(op.inputs)
    saved = []

    def mm(spec, x, y, of, which):
        contracted = [c for c in space if c not in parse_spec(spec)[1][0]]
        coeff = sp.nsimplify(scale) * (2 if contracted else 1)
        kind = MATMUL if contracted else OTHER
        (out,) = e.op("einsum", spec, [x, y], [of], flop_terms=[(coeff, space, kind)],
                      linear_reduce=contracted, suffix=f"bwd.{which}",
                      attrs={"flops_scale": scale, "einsum": spec})
        return out

    if needs[0]:  # data gradient first, as Megatron runs dgrad before wgrad
        grads[0] = mm(f"{to},{tb}->{ta}", g, b, a, "dgrad" if b.role is Role.PARAMETER else "d0")
        saved.append(b)
    if needs[1]:
        grads[1] = mm(f"{ta},{to}->{tb}", a, g, b, "wgrad" if b.role is Role.PARAMETER else "d1")
        saved.append(a)
    if len(op.inputs) == 3 and needs[2]:
        grads[2] = e.reduce_to(g, to, op.inputs[2], ins[2])
    op.saved = tuple(dict.fromkeys(saved))
    return grads


@vjp("elementwise", "add")
def _add(e, op, gs, needs):
    ins, (to,) = parse_spec(op.spec)
    (g,) = gs
    op.saved = ()
    return [e.reduce_to(g, to, x, term) if need else None for x, term, need in zip(op.inputs, ins, needs)]


def _pointwise_bwd(e, op, g, extra, flops, of, name="bwd"):
    ins, outs = parse_spec(op.spec)
    to = outs[0]
    letters = [to] + [ins[op.inputs.index(x)] if x in op.inputs else to for x in extra]
    spec = ",".join(letters) + f"->{to}"
    (out,) = e.op("elementwise", spec, [g, *extra], [of], fn=f"{op.fn}_bwd",
                  flop_terms=[(flops, to, OTHER)], suffix=name)
    return out


@vjp("elementwise", "gelu", "silu")
def _unary_saving_input(e, op, gs, needs):
    x = op.inputs[0]
    op.saved = (x,)
    return [_pointwise_bwd(e, op, gs[0], [x], kernels.ELEMENTWISE[op.fn][1], x) if needs[0] else None]


@vjp("elementwise", "rope", "scale")
def _linear_unary(e, op, gs, needs):
    op.saved = ()
    return [_pointwise_bwd(e, op, gs[0], [], kernels.ELEMENTWISE[op.fn][1], op.inputs[0]) if needs[0] else None]


@vjp("elementwise", "bias_gelu")
def _bias_gelu(e, op, gs, needs):
    x, bias = op.inputs
    ins, (to,) = parse_spec(op.spec)
    op.saved = (x, bias)
    dx = _pointwise_bwd(e, op, gs[0], [x, bias], kernels.ELEMENTWISE["bias_gelu"][1], x)
    dbias = e.reduce_to(dx, to, bias, ins[1]) if needs[1] else None
    return [dx if needs[0] else None, dbias]


@vjp("elementwise", "mul", "swiglu")
def _binary_product(e, op, gs, needs):
    x, y = op.inputs
    (tx, ty), (to,) = parse_spec(op.spec)
    op.saved = (x, y)
    dx, dy = e.op("elementwise", f"{to},{tx},{ty}->{tx},{ty}", [gs[0], x, y], [x, y], fn=f"{op.fn}_bwd",
                  flop_terms=[(kernels.ELEMENTWISE[op.fn][1], to, OTHER)])
    return [dx if needs[0] else None, dy if needs[1] else None]


@vjp("elementwise", "dropout", "dropout_add", "bias_dropout_add")
def _dropout(e, op, gs, needs):
    ins, outs = parse_spec(op.spec)
    to = outs[0]
    g = gs[0]
    mask = op.outputs[1]
    op.saved = (mask,)
    x = op.inputs[0]
    grads: list[Tensor | None] = [None] * len(op.inputs)
    if needs[0] or (op.fn == "bias_dropout_add" and needs[1]):
        (dx,) = e.op("elementwise", f"{to},{to}->{to}", [g, mask], [x], fn="dropout_bwd",
                     flop_terms=[(kernels.ELEMENTWISE["dropout"][1], to, OTHER)])
        grads[0] = dx if needs[0] else None
        if op.fn == "bias_dropout_add" and needs[1]:
            grads[1] = e.reduce_to(dx, to, op.inputs[1], ins[1])
    if op.fn != "dropout" and needs[-1]:
        grads[-1] = g  # the residual passes its gradient through unchanged
    return grads


@vjp("softmax")
def _softmax(e, op, gs, needs):
    (y,) = op.outputs
    (to,) = parse_spec(op.spec)[1]
    op.saved = (y,)
    if not needs[0]:
        return [None]
    (dx,) = e.op("softmax", f"{to},{to}->{to}", [gs[0], y], [op.inputs[0]], fn="softmax_bwd",
                 flop_terms=[(kernels.SOFTMAX[1], to, OTHER)], whole=op.whole)
    return [dx]


@vjp("norm", "layernorm", "rmsnorm", "gated_rmsnorm")
def _norm(e, op, gs, needs):
    ins, (to,) = parse_spec(op.spec)
    rows = [t for t, term in zip(op.inputs, ins) if term == to]  # x (and the gate)
    params = op.inputs[len(rows):]
    op.saved = tuple(op.inputs)
    normed = op.attrs.get("over", to[-1])
    pterms = ins[len(rows):]
    spec = ",".join([to] * (1 + len(rows)) + pterms) + "->" + ",".join([to] * len(rows) + pterms)
    attrs = {"over": normed}
    if "sharded_whole" in op.attrs:
        attrs["sharded_whole"] = op.attrs["sharded_whole"]  # the backward's row sums, reduced the same way
    outs = e.op("norm", spec, [gs[0], *rows, *params], [*rows, *params], fn=f"{op.fn}_bwd",
                flop_terms=[(kernels.NORM[op.fn][1], to, OTHER)],
                linear_reduce=[c for c in to if not any(c in t for t in pterms)], whole=op.whole, attrs=attrs)
    return [o if need else None for o, need in zip(outs, needs)]


@vjp("embedding")
def _embedding(e, op, gs, needs):
    tokens, table = op.inputs[0], op.inputs[1]
    g = gs[0]
    op.saved = (tokens,)
    grads: list[Tensor | None] = [None] * len(op.inputs)
    if needs[1]:
        # scatter-add of the output gradient into the rows looked up: one add per element
        (grads[1],) = e.op("embedding", "bsh,bs->vh", [g, tokens], [table], fn="scatter_add",
                           flop_terms=[(kernels.REDUCTION_SUM, "bsh", OTHER)],
                           byte_terms=[(g.itemsize, "bsh"), (tokens.itemsize, "bs"), (2 * table.itemsize, "bsh")],
                           linear_reduce=["b", "s"], suffix="bwd.scatter")
    if len(op.inputs) == 3 and needs[2]:
        pos = op.inputs[2]
        # the first s rows of the position table receive the sum over the batch
        (grads[2],) = e.op("embedding", "bsh->ph", [g], [pos], fn="scatter_add",
                           flop_terms=[(kernels.REDUCTION_SUM, "bsh", OTHER)],
                           byte_terms=[(g.itemsize, "bsh"), (2 * pos.itemsize, "sh")],
                           linear_reduce=["b", "s"], suffix="bwd.positions")
    return grads


@vjp("fused", "cross_entropy")
def _cross_entropy(e, op, gs, needs):
    logits, labels = op.inputs
    probs = op.outputs[1]
    op.saved = (probs, labels)
    if not needs[0]:
        return [None, None]
    (tv, tok), _ = parse_spec(op.spec)  # "bsv,bs->..." (a classifier's: "bv,b->...")
    (dlogits,) = e.op("fused", f"{tok},{tv},{tok}->{tv}", [gs[0], probs, labels], [logits], fn="cross_entropy_bwd",
                      flop_terms=[(kernels.CROSS_ENTROPY[1], tv, OTHER)])
    return [dlogits, None]


@vjp("fused", "flash_attention")
def _flash(e, op, gs, needs):
    q, k, v = op.inputs
    o, lse = op.outputs
    op.saved = (q, k, v, o, lse)
    causal = op.attrs.get("causal_flops", op.attrs.get("flops_scale", 1) != 1)
    window = op.attrs.get("window")
    # FlashAttention backward: recompute Q·K^T, then dV = P^T·dO, dP = dO·V^T,
    # dQ = dS·K, dK = dS^T·Q: five matmuls over the score space; a soft-cap is
    # recomputed with the scores and differentiated (its forward and backward counts)
    per_score = kernels.SOFTMAX[1] + (sum(kernels.SOFTCAP) if "softcap" in op.attrs else 0)
    value = "v" if op.attrs.get("separate_value_dim") else "d"
    if value == "d":
        terms = pair_terms(5 * 2, "bsgrdk", MATMUL, causal, window)
        spec = "bsgrd,bsgrd,bkgd,bkgd,bsgrd,bgrs->bsgrd,bkgd,bkgd"
    else:
        # v and the output over their own head dim (letter v): Q·K^T, dQ, dK over d; dV, dP over v
        terms = pair_terms(3 * 2, "bsgrdk", MATMUL, causal, window) + pair_terms(2 * 2, "bsgrvk", MATMUL, causal,
                                                                                  window)
        spec = "bsgrv,bsgrd,bkgd,bkgv,bsgrv,bgrs->bsgrd,bkgd,bkgv"
    terms += pair_terms(per_score, "bgrsk", OTHER, causal, window)
    attrs = {key: op.attrs[key] for key in ("flops_scale", "causal_flops", "causal", "separate_value_dim", "window",
                                            "softcap", "ring_letter") if key in op.attrs}
    outs = e.op("fused", spec,
                [gs[0], q, k, v, o, lse], [q, k, v], fn="flash_attention_bwd", flop_terms=terms,
                whole=["k"], linear_reduce=["s", "r"], attrs=attrs, free_letters=op.free_letters)
    return [x if need else None for x, need in zip(outs, needs)]


@vjp("view", "split", "reshape")
def _view(e, op, gs, needs):
    ins, outs = parse_spec(op.spec)
    op.saved = ()
    if not needs[0]:
        return [None]
    missing = [t.name for t, g in zip(op.outputs, gs) if g is None]
    if missing:
        raise ValueError(f"view {op.name}: outputs {missing} have no gradient; every part of a split must be used")
    spec = ",".join(outs) + "->" + ins[0]
    (dx,) = e.op("view", spec, list(gs), [op.inputs[0]], fn="concat" if len(outs) > 1 else "reshape")
    return [dx]


@vjp("reduction", "sum")
def _sum(e, op, gs, needs):
    (ti,), (to,) = parse_spec(op.spec)
    op.saved = ()
    if not needs[0]:
        return [None]
    (dx,) = e.op("view", f"{to}->{ti}", [gs[0]], [op.inputs[0]], fn="broadcast")
    return [dx]


# --------------------------------------------------------------------------- driver


def _accumulate(e: _Emitter, t: Tensor, parts: list[Tensor]) -> Tensor:
    """Gradient contributions to one tensor are summed by one n-ary add kernel."""
    if len(parts) == 1:
        return parts[0]
    letters = "abcdefghijklmnopqrstuvwxyz"[: t.rank]
    spec = ",".join([letters] * len(parts)) + f"->{letters}"
    (out,) = e.op("elementwise", spec, parts, [t], fn="add",
                  flop_terms=[(len(parts) - 1, letters, OTHER)], partial_ok=True, suffix=f"grad_acc.{t.name}",
                  attrs={"accumulate": True})
    return out


def differentiate(forward: Graph, optimizer: OptimizerConfig = OptimizerConfig()) -> Graph:
    """The training graph of ``forward``: forward, backward and optimizer ops.

    Raises ``ValueError`` when an op kind has no VJP rule or a parameter gets no
    gradient.
    """
    if forward.loss is None:
        raise ValueError(f"graph {forward.name} has no loss")
    g = Graph(name=forward.name, params=list(forward.params), inputs=list(forward.inputs),
              loss=forward.loss, dims=dict(forward.dims), meta=dict(forward.meta), registered=dict(forward.registered))
    g.ops = list(forward.ops)
    e = _Emitter(g)

    needs_grad: set[Tensor] = set(forward.params)
    for op in forward.ops:
        if any(t in needs_grad for t in op.inputs):
            for t in op.outputs:
                if t.dtype in FLOAT_DTYPES:
                    needs_grad.add(t)

    seed = Tensor(f"{forward.loss.name}.grad", forward.loss.shape, forward.loss.dtype, Role.GRADIENT,
                  grad_of=forward.loss)
    g.inputs.append(seed)
    parts: dict[Tensor, list[Tensor]] = {forward.loss: [seed]}

    for op in reversed(forward.ops):
        e.fwd = op
        out_grads = []
        for t in op.outputs:
            contributions = parts.pop(t, None)
            out_grads.append(_accumulate(e, t, contributions) if contributions else None)
        if all(x is None for x in out_grads):
            continue
        rule = registered_rule(forward, op) or RULES.get((op.kind, op.fn)) or RULES.get((op.kind, ""))
        if rule is None:
            raise ValueError(f"no VJP rule for op {op.name} (kind {op.kind!r}, kernel {op.fn!r})")
        needs = [t in needs_grad for t in op.inputs]
        for t, grad in zip(op.inputs, rule(e, op, out_grads, needs)):
            if grad is not None:
                parts.setdefault(t, []).append(grad)

    missing = [p.name for p in forward.params if p not in parts]
    if missing:
        raise ValueError(f"parameters without a gradient: {', '.join(missing)}")
    for p in forward.params:
        e.fwd = next(op for op in forward.ops if p in op.inputs)
        g.grads[p] = _accumulate(e, p, parts.pop(p))

    _add_optimizer(g, optimizer)
    return g


def _add_optimizer(g: Graph, cfg: OptimizerConfig) -> None:
    """One Adam update per parameter: reads its gradient and fp32 state, writes the bf16 weight."""
    for p in g.params:
        grad = g.grads[p]
        names = ("master", "exp_avg", "exp_avg_sq") if cfg.master_weights else ("exp_avg", "exp_avg_sq")
        state = tuple(Tensor(f"{p.name}.{n}", p.shape, cfg.state_dtype, Role.OPTIMIZER_STATE) for n in names)
        g.opt_state[p] = state
        letters = "abcdefghijklmnopqrstuvwxyz"[: p.rank]
        state_bytes = sum(2 * t.itemsize for t in state)  # each state element read and written
        new = Tensor(f"{p.name}.next", p.shape, p.dtype, Role.PARAMETER)
        op = Op(
            name=f"{p.name}.adam",
            kind="optimizer",
            fn="adam",
            inputs=(grad, *state),
            outputs=(new,),
            spec=",".join([letters] * (1 + len(state))) + f"->{letters}",
            flop_terms=((kernels.ADAM_FLOPS, letters, OTHER),),
            byte_terms=((grad.itemsize + state_bytes + p.itemsize, letters),),
            phase=OPTIMIZER,
            attrs={"param": p},
        )
        g.ops.append(op)


def saved_activations(graph: Graph) -> list[Tensor]:
    """Distinct activation tensors some backward reads, in forward order."""
    out: dict[Tensor, None] = {}
    for op in graph.forward_ops:
        for t in op.saved:
            if t.role is Role.ACTIVATION:
                out[t] = None
    return list(out)


def activation_bytes(graph: Graph):
    """Symbolic bytes of the saved activations of one micro-batch (no sharding)."""
    return sum((t.nbytes for t in saved_activations(graph)), sym.ONE * 0)


# --------------------------------------------------------------------------- VJP rules: MoE and concat
# (appended with GraphBuilder.router, .dispatch, .combine, .concat and the sigmoid kernel)

RULES[("elementwise", "sigmoid")] = _unary_saving_input
RULES[("elementwise", "relu2")] = _unary_saving_input
RULES[("elementwise", "geglu")] = _binary_product


@vjp("elementwise", "softcap")
def _softcap(e, op, gs, needs):
    """y = c·tanh(x/c): the backward reads y (dy·(1 - (y/c)²)), not x."""
    (y,) = op.outputs
    op.saved = (y,)
    return [_pointwise_bwd(e, op, gs[0], [y], kernels.SOFTCAP[1], op.inputs[0]) if needs[0] else None]


@vjp("fused", "moe_router")
def _moe_router(e, op, gs, needs):
    (logits,) = op.inputs
    weights, scores = op.outputs
    op.saved = (weights, scores)  # the top-k choice and every expert's score
    if not needs[0] or gs[0] is None:
        return [None]
    tok = op.attrs["token_letters"]
    k = op.attrs["experts_per_token"]
    terms = [(kernels.ROUTER_SCORE[op.attrs["score"]][1] + kernels.ROUTER_TOPK[1], tok + "e", OTHER)]
    if op.attrs.get("normalize"):
        terms.append((kernels.ROUTER_TOPK_NORM[1] * k, tok, OTHER))
    if op.attrs.get("scale", 1) != 1:
        terms.append((kernels.ROUTER_SCALE[1] * k, tok, OTHER))
    t = tok + "e"
    (dlogits,) = e.op("fused", f"{t},{t},{t}->{t}", [gs[0], weights, scores], [logits], fn="moe_router_bwd",
                      flop_terms=terms, whole=["e"], attrs=dict(op.attrs))
    return [dlogits]


@vjp("fused", "moe_dispatch")
def _moe_dispatch(e, op, gs, needs):
    x, weights = op.inputs
    op.saved = (weights,)  # which slots each token's rows went to
    if not needs[0]:
        return [None, None]
    tok = op.attrs["token_letters"]
    k = op.attrs["experts_per_token"]
    g = gs[0]
    # gather each token's k slot gradients back and sum them: k - 1 adds per element
    (dx,) = e.op("fused", f"ech,{tok}e->{tok}h", [g, weights], [x], fn="moe_dispatch_bwd",
                 flop_terms=[(k - 1, tok + "h", OTHER)],
                 byte_terms=[(k * g.itemsize, tok + "h"), (x.itemsize, tok + "h"), (4 * k, tok)],
                 attrs=dict(op.attrs))
    return [dx, None]  # the routing choice itself has no gradient


@vjp("fused", "moe_combine")
def _moe_combine(e, op, gs, needs):
    expert_out, weights = op.inputs
    op.saved = (expert_out, weights)
    tok = op.attrs["token_letters"]
    k = op.attrs["experts_per_token"]
    g = gs[0]
    item = expert_out.itemsize
    d_out, d_weights = e.op(
        "fused", f"{tok}h,ech,{tok}e->ech,{tok}e", [g, expert_out, weights], [expert_out, weights],
        fn="moe_combine_bwd", flop_terms=[(kernels.COMBINE[1] * k, tok + "h", OTHER)],
        byte_terms=[(g.itemsize, tok + "h"), (k * item, tok + "h"), (k * (weights.itemsize + 4), tok),
                    (item, "ech"), (weights.itemsize, tok + "e")],
        attrs=dict(op.attrs))
    return [d_out if needs[0] else None, d_weights if needs[1] else None]


@vjp("view", "concat")
def _concat(e, op, gs, needs):
    ins, (to,) = parse_spec(op.spec)
    joined = op.attrs["joined_letter"]
    op.saved = ()
    g = gs[0]
    grads: list[Tensor | None] = [None] * len(op.inputs)
    whole, whole_idx = [], []
    for i, (x, term, part) in enumerate(zip(op.inputs, ins, op.attrs["part_letters"])):
        if not needs[i]:
            continue
        piece = to.replace(joined, part)
        if sorted(piece) == sorted(term):
            whole.append(term)
            whole_idx.append(i)
        else:
            # a broadcast input: its slice of the gradient summed over the letters it lacks
            reduced = [c for c in piece if c not in term]
            (grads[i],) = e.op("reduction", f"{to}->{term}", [g], [x], fn="sum",
                               flop_terms=[(kernels.REDUCTION_SUM, piece, OTHER)], linear_reduce=reduced,
                               byte_terms=[(g.itemsize, piece), (x.itemsize, term)],
                               suffix=f"bwd.reduce.{x.name.rsplit('.', 1)[-1]}")
    if whole:
        outs = e.op("view", f"{to}->" + ",".join(whole), [g], [op.inputs[i] for i in whole_idx], fn="split")
        for i, t in zip(whole_idx, outs):
            grads[i] = t
    return grads


# --------------------------------------------------------------------------- VJP rules: state-space models
# (appended with GraphBuilder.causal_conv1d and .ssd_scan)


@vjp("fused", "causal_conv1d")
def _causal_conv1d(e, op, gs, needs):
    """causal_conv1d_bwd: recomputes the conv and its SiLU from the kept input, then dx, dw, dbias."""
    x, w, bias = op.inputs
    op.saved = (x, w, bias)
    ins, outs = parse_spec(op.spec)
    to = outs[0]  # the second output, the conv state, is for inference
    taps = op.attrs["taps"]
    terms = [(kernels.CONV_PER_TAP[1] * taps + kernels.CONV_BIAS_SILU[1], to, OTHER)]
    outs = e.op("fused", f"{to},{to},{ins[1]},{ins[2]}->{to},{ins[1]},{ins[2]}", [gs[0], x, w, bias], [x, w, bias],
                fn="causal_conv1d_bwd", flop_terms=terms, linear_reduce=["b", "s", "k"], whole=["s"],
                attrs=dict(op.attrs))
    return [o if need else None for o, need in zip(outs, needs)]


@vjp("fused", "ssd_scan")
def _ssd_scan(e, op, gs, needs):
    """The SSD scan's backward (mamba_ssm's _mamba_chunk_scan_combined_bwd).

    Matmuls: twice the forward's (each product's two operand gradients: dstates Cᵀ·dy,
    dx from the diagonal blocks and from the states, d(C·Bᵀ) from dy·xᵀ, dB and dC from
    d(C·Bᵀ) and from the states) plus the forward's C·Bᵀ and chunk states, recomputed
    rather than kept.  Elementwise work: the SSD_* backward counts, and the state passing
    recomputed.  Kept from forward: the inputs, the output and the fp32 dA_cumsum.
    """
    x, dt, a_log, b, c, d, dt_bias = op.inputs
    y, cumsum = op.outputs[:2]  # the third, the final state, is for inference
    op.saved = (x, dt, a_log, b, c, d, dt_bias, y, cumsum)
    q = op.attrs["chunk"]
    terms = [
        (3 * 2 * q, "bsgn", MATMUL),  # C·Bᵀ recomputed, dB and dC through it
        (2 * 2 * q, "bsgrp", MATMUL),  # dx through the diagonal blocks, d(C·Bᵀ)
        (5 * 2, "bsgrpn", MATMUL),  # chunk states recomputed, dstates, dx, dB, dC through the states
        ((kernels.SSD_PASS[0] + kernels.SSD_PASS[1]) / q, "bsgrpn", OTHER),
        (kernels.SSD_DT[1], "bsgr", OTHER),
        (kernels.SSD_MASK[1] * q, "bsgr", OTHER),
        (kernels.SSD_OUT[1], "bsgrp", OTHER),
    ]
    item = x.itemsize
    nbytes = [(4 * item, "bsgrp"), (2 * dt.itemsize + 4 * 4, "bsgr"), (6 * b.itemsize, "bsgn"),
              (4 * b.itemsize * q, "bsg"), (32 / q, "bsgrpn")]
    outs = e.op("fused", "bsgrp,bsgrp,bsgr,gr,bsgn,bsgn,gr,gr,bsgrp,bsgr->bsgrp,bsgr,gr,bsgn,bsgn,gr,gr",
                [gs[0], x, dt, a_log, b, c, d, dt_bias, y, cumsum], [x, dt, a_log, b, c, d, dt_bias],
                fn="ssd_scan_bwd", flop_terms=terms, byte_terms=nbytes, linear_reduce=["b", "s", "r", "p", "n"],
                whole=["s"], attrs=dict(op.attrs))
    return [o if need else None for o, need in zip(outs, needs)]


# --------------------------------------------------------------------------- registered kernels
# (stage_core.kernels: a model plugin's own kernels, scoped to its graphs)


def registered_rule(graph: Graph, op: Op) -> Rule | None:
    """The VJP rule of a kernel the graph's model registered (``graph.registered``), else None."""
    spec = graph.registered.get(op.fn)
    if spec is None or op.attrs.get("registered") != spec.name:
        return None

    def rule(e: _Emitter, op: Op, gs, needs):
        from .kernels import Grads, KernelCall, check_def, resolve_ref

        if spec.backward is None:
            op.saved = ()
            return [None] * len(op.inputs)
        call = KernelCall(op.inputs, op.attrs.get("params", {}), graph.dims)
        defs = spec.backward(Grads(call, op.outputs, op.spec, tuple(needs), op.attrs))
        grads: list[Tensor | None] = [None] * len(op.inputs)
        saved: dict[Tensor, None] = {}
        for j, d in enumerate(defs):
            check_def(d, f"{spec.name} (backward kernel {j})", len(d.reads), len(d.grads))
            if not any(needs[i] for i in d.grads if i < len(needs)):
                continue  # nobody needs what it computes (a first layer's input gradient)
            if any(not isinstance(i, int) or not 0 <= i < len(op.inputs) for i in d.grads):
                from .kernels import KernelError

                raise KernelError(f"kernel {spec.name}: backward kernel {j} writes gradients {list(d.grads)}; the "
                                  f"kernel has inputs 0..{len(op.inputs) - 1}")
            reads = [resolve_ref(r, spec.name, op.inputs, op.outputs, gs) for r in d.reads]
            for r, t in zip(d.reads, reads):
                if not r.startswith("dy"):
                    saved[t] = None
            targets = [op.inputs[i] for i in d.grads]
            weight = d.weight if d.weight is not None else all(t.role is Role.PARAMETER for t in targets)
            outs = e.op(spec.kind, d.spec, reads, targets, fn=f"{spec.name}_bwd",
                        flop_terms=list(d.flops), byte_terms=list(d.bytes or ()), linear_reduce=d.reduce,
                        whole=d.whole, partial_ok=d.partial_ok, attrs={**d.attrs, "weight_grad": weight},
                        free_letters=dict(d.free_letters), suffix=f"bwd.{j}",
                        out_dtypes=[t.dtype for t in targets])
            for i, t in zip(d.grads, outs):
                grads[i] = t
        op.saved = tuple(saved)
        missing = [i for i, need in enumerate(needs) if need and grads[i] is None]
        if missing:
            from .kernels import KernelError

            raise KernelError(f"kernel {spec.name}: its backward gives no gradient of input {missing[0]} "
                              f"({op.inputs[missing[0]].name})")
        return grads

    return rule
