"""MoE token routing between the two views of the ranks (Megatron-Core's token dispatchers).

Outside the experts, tokens are placed on ``tp`` (replicated, or split over the
sequence under SP), ``cp`` and ``dp``.  The experts' tensors ``[E, c, h]`` (experts,
slots, row) are placed on the expert view: ``ep`` splits the experts, ``edp`` the
slots (each expert-data-parallel replica has its own tokens), ``etp`` the experts'
FFN width.  A dispatch, a combine and their backward kernels are the only ops that
read one view and write the other; this module plans them.

With the ``alltoall`` dispatcher (Megatron's default) a rank permutes its own
tokens' k rows into expert order, exchanges them with its ``ep`` group (one
all-to-all of tokens·k rows), and, when the expert tensor-parallel ranks hold
different tokens (SP), all-gathers them over ``etp``; the combine reduce-scatters
the experts' partial outputs over ``etp`` and sends the rows back (all-to-all).
Backward runs the conjugates.  Without SP (tp > 1) the TP ranks hold the same
tokens, so ``etp`` must be the tp group: the experts' partial outputs stay Partial
through the combine and are reduced once per token with the rest of the layer
(Megatron-Core requires SP for MoE with tp; STAGE allows both).

With the ``allgather`` dispatcher every rank all-gathers the tokens (and their
routing weights) of its ``ep`` group (and ``etp`` group under SP), runs its own
experts on the rows routed to them, and reduce-scatters the outputs back: traffic
of tokens·h, not tokens·k·h, per rank.
"""

from __future__ import annotations

from ..ir.graph import Graph
from ..ir.ops import BACKWARD, FORWARD, Op, parse_spec
from ..ir.tensor import Tensor
from ..trace import CollectiveType
from .placement import Partial, Shard, layout_key

DISPATCH, COMBINE = "moe_dispatch", "moe_combine"
BOUNDARY = (DISPATCH, COMBINE, DISPATCH + "_bwd", COMBINE + "_bwd")


def is_boundary(op: Op) -> bool:
    return op.fn in BOUNDARY


def expert_tensors(g: Graph) -> set[Tensor]:
    """Tensors in the expert view: from each dispatch's output up to its combine's
    input, the weights the ops in between read, and the gradients of all of them."""
    region: set[Tensor] = set()
    params = set(g.params)
    for op in g.ops:
        if op.phase != FORWARD:
            continue
        if op.fn == DISPATCH:
            region.update(op.outputs)
        elif op.fn != COMBINE and any(t in region for t in op.inputs):
            region.update(op.outputs)
            region.update(t for t in op.inputs if t in params)
    for op in g.ops:
        if op.phase == BACKWARD:
            region.update(t for t in op.outputs if t.grad_of in region)
    return region


def plan_boundary(prop, op: Op, phase: str):
    """The plan of a dispatch, a combine or the backward of either (``prop`` is the propagator)."""
    from .propagate import KernelComm, OpPlan, PropagationError

    ins, outs = parse_spec(op.spec)
    tok = op.attrs["token_letters"]
    dispatcher = prop.sg.moe_dispatcher
    token_side = [i for i, t in enumerate(op.inputs) if t not in prop.expert]
    expert_side = [i for i, t in enumerate(op.inputs) if t in prop.expert]

    # the tokens' placement: the routing weights' (the token rows' in a forward dispatch)
    anchor = op.inputs[0] if op.fn == DISPATCH else next(op.inputs[i] for i in token_side
                                                          if ins[i] == tok + "e")
    anchor_term = ins[op.inputs.index(anchor)]
    tokens = {a: p for a, p in prop.start_layout(anchor).items()
              if a in prop.axes and isinstance(p, Shard) and isinstance(p.dim, int)
              and anchor_term[p.dim] in tok}
    tp_shares = "tp" in prop.axes and "tp" not in tokens  # TP ranks hold the same tokens
    if tp_shares and prop.sg.degrees.get("etp", 1) != prop.sg.degrees.get("tp", 1):
        raise PropagationError(
            f"op {op.name}: without sequence parallel the TP ranks hold the same tokens, so the experts' "
            f"tensor-parallel degree must be tp ({prop.sg.degrees.get('tp')}), not "
            f"{prop.sg.degrees.get('etp')}; use --sp or --etp {prop.sg.degrees.get('tp')}")
    etp = "etp" in prop.expert_axes
    gather_etp = etp and not tp_shares  # expert TP ranks hold different tokens
    ep = "ep" in prop.expert_axes
    group = "+".join(a for a, on in (("etp", gather_etp), ("ep", ep)) if on)  # the allgather group
    width = (prop.sg.degrees.get("etp", 1) if gather_etp else 1) * (prop.sg.degrees.get("ep", 1) if ep else 1)

    def token_layout(term: str) -> dict:
        return {a: Shard(term.index(anchor_term[p.dim])) for a, p in tokens.items()}

    def slot_layout(etp_shard: bool) -> dict:
        out = {}
        if ep:
            out["ep"] = Shard(0)
        if "edp" in prop.expert_axes:
            out["edp"] = Shard(1)
        if etp_shard:
            out["etp"] = Shard(1)
        return out

    plan = OpPlan(op)
    start = [prop.start_layout(t) for t in op.inputs]
    target = [dict(s) for s in start]
    for i in token_side:
        target[i] = token_layout(ins[i])
    out_layouts: list[dict] = []
    comm = []

    if op.fn == DISPATCH:
        (x, w) = op.inputs
        out_layouts.append(slot_layout(gather_etp and dispatcher == "alltoall"))
        if dispatcher == "alltoall" and ep:
            comm.append(KernelComm(CollectiveType.ALL_TO_ALL, "ep", "ech", op.outputs[0].itemsize))
        elif dispatcher == "allgather" and group:
            comm.append(KernelComm(CollectiveType.ALL_GATHER, group, tok + "h", x.itemsize, before=True))
            comm.append(KernelComm(CollectiveType.ALL_GATHER, group, tok, w.itemsize, before=True, whole="e"))
    elif op.fn in (COMBINE, DISPATCH + "_bwd"):
        # expert rows (partial over etp from the row-parallel down projection, or the
        # partial input gradients of gate and up) back to tokens
        (e,) = expert_side
        partial = isinstance(start[e].get("etp"), Partial)
        slots = slot_layout(False)
        if partial:
            if dispatcher == "alltoall" and gather_etp:
                slots["etp"] = Shard(1)  # reduce-scatter over etp before the rows go back
            else:
                slots["etp"] = Partial()
        elif isinstance(start[e].get("etp"), Shard) and dispatcher == "alltoall":
            slots["etp"] = Shard(1)
        target[e] = slots
        out = token_layout(outs[0])
        if isinstance(slots.get("etp"), Partial) and tp_shares:
            out["tp"] = Partial()  # reduced once per token, later (TP ranks share tokens)
        out_layouts.append(out)
        row = op.outputs[0].itemsize
        if dispatcher == "alltoall" and ep:
            comm.append(KernelComm(CollectiveType.ALL_TO_ALL, "ep", "ech", op.inputs[e].itemsize, before=True))
        elif dispatcher == "allgather" and group:
            comm.append(KernelComm(CollectiveType.REDUCE_SCATTER, group, tok + "h", row * width))
    else:  # combine backward: token gradients to expert rows, and the routing weights' gradient
        dy, y = op.inputs[0], 1
        forward = prop.plans[op.forward_op]
        target[y] = dict(forward.in_layouts[0])  # the expert rows as the forward combine read them
        partial = isinstance(target[y].get("etp"), Partial)
        out_layouts.append(slot_layout(gather_etp and dispatcher == "alltoall"))
        dw = token_layout(outs[1])
        if partial and tp_shares:
            dw["tp"] = Partial()  # from partial expert rows: a small reduction of [tokens, E]
        out_layouts.append(dw)
        if dispatcher == "alltoall" and ep:
            comm.append(KernelComm(CollectiveType.ALL_TO_ALL, "ep", "ech", op.outputs[0].itemsize))
        elif dispatcher == "allgather" and group:
            comm.append(KernelComm(CollectiveType.ALL_GATHER, group, tok + "h", dy.itemsize, before=True))
            comm.append(KernelComm(CollectiveType.REDUCE_SCATTER, group, tok, op.outputs[1].itemsize * width,
                                   whole="e"))

    for t, s, tgt in zip(op.inputs, start, target):
        if layout_key(s) != layout_key(tgt):
            plan.pre += prop.move(t, s, tgt, phase)
    plan.in_layouts = target
    plan.out_layouts = out_layouts
    plan.kernel_comms = comm
    # local sizes: the tokens as the token side holds them, the slots as the expert side
    letters: dict[str, tuple[str, ...]] = {}
    for a, p in tokens.items():
        letters[anchor_term[p.dim]] = letters.get(anchor_term[p.dim], ()) + (a,)
    slots_at = next((tgt for i, tgt in enumerate(target) if i in expert_side), out_layouts[0])
    for a, p in slots_at.items():
        if isinstance(p, Shard):
            letter = "ech"[p.dim]
            letters[letter] = letters.get(letter, ()) + (a,)
    plan.letter_axes = letters
    return plan

