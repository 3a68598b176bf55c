"""The fast estimate: thousands of plans from a few measured layers, at schedule-step
granularity, vectorised over the plans that share a pipeline shape.

``stage estimate`` replays every node of every micro-batch.  Here a plan is put together
from its layer key's measured costs (:mod:`.probe`): a chunk's forward and backward
are its layers' (plus the embedding on the first chunk, the LM head and loss on the
last), and the step is

* the pipeline: the schedule's steps (any ``ScheduleSpec``: 1F1B, interleaved, GPipe)
  as a dependency graph, each step waiting for its stage's previous step and for the
  step it needs on the neighbouring stage plus the message between them; a step with
  TP/CP/EP collectives also waits for its stage's previous send, which holds the one
  communication slot.  Evaluated with numpy for all plans of one (pp, virtual stages,
  micro-batches, schedule) at once;
* then per stage, after its last backward: the data-parallel reduction of its
  gradients in Megatron's buckets (the network model's ring on the real dp group), of
  which the part that fits in 80% of the last backward steps' compute is hidden (as
  the overlap placement does), and the optimizer (its kernels, sharded by ZeRO, in
  flow with ZeRO-1/2's parameter all-gathers);
* ZeRO-3: every layer's parameter all-gather, forward and backward, is placed in the
  layer before it as the overlap placement does (pieces in 80% of each window between
  foreground communications, the rest after the last); what the network takes longer
  over is exposed, and so are the gathers of a chunk's first layer and of what lies
  outside the layers; the gathers also take the windows the gradient buckets would use.

Memory per stage is the lowering's: parameters, gradients and optimizer state sharded
as the ZeRO stage says, and the activations of the micro-batches in flight at the worst
point of the schedule (the schedule's own order, walked).

This is an approximation of the replay; ``stage search`` ranks plans with it and then
estimates the best ones with the replay (``stage estimate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from stage_core.api import DTYPE_BYTES, MIN_PIECE_BYTES, WINDOW_USE, Mesh, Plan, hardware, netmodel
from stage_core.records import HardwareSpec

from .probe import LayerCosts, layer_key
from .space import stage_layers



@dataclass
class FastResult:
    step_ns: np.ndarray  # per plan
    memory: np.ndarray  # bytes, the busiest stage
    exposed_comm_ns: np.ndarray  # the busiest stage's step less its compute: waits of every kind
    compute_ns: np.ndarray  # the busiest stage's compute (forward, backward, optimizer)
    model_flops: np.ndarray  # per GPU per step, Megatron's convention (the mean over ranks)


def chunk_layers(layers: int, plan: Plan) -> tuple[int, ...]:
    chunks = plan.pp * plan.virtual_stages
    split = plan.stage_layers if isinstance(plan.stage_layers, tuple) else stage_layers(layers, chunks)
    if split is None:
        return (layers // chunks,) * chunks
    return tuple(split)


def estimate_plans(plans: list[Plan], costs: dict[tuple, LayerCosts], layers: int, hw: HardwareSpec,
                   orders, capacity: float | None = None, times: bool = True) -> FastResult:
    """Memory and step time of every plan; ``costs`` maps each plan's layer key to its
    measured layer; ``orders(name)`` gives a schedule's ``order(stages, micro_batches, virtual)``.
    With ``capacity`` (bytes per GPU) a plan that needs more gets its memory only (its step
    time is infinite); with ``times=False`` every plan does."""
    n = len(plans)
    out = FastResult(np.full(n, np.inf), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n))
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(plans):
        groups.setdefault((p.pp, p.virtual_stages, p.micro_batches, p.schedule), []).append(i)
    for (pp, vp, m, schedule), idx in groups.items():
        order = orders(schedule)
        _group(out, [plans[i] for i in idx], np.array(idx), costs, layers, hw, pp, vp, m, order,
               np.inf if capacity is None else capacity, times)
    return out


#: Part fields summed per chunk and per stage
_FIELDS = ("fwd_ns", "bwd_ns", "bwd_comm_ns", "activations", "params", "grads", "optimizer", "adam_ns",
           "grad_elements", "model_flops")


def _group(out: FastResult, plans, idx, costs, layers, hw, pp, vp, m, order, capacity, times) -> None:
    """Every plan of one pipeline shape at once: arrays of plans x chunks and plans x stages.
    Memory first; the step time of the plans that fit."""
    chunks = pp * vp
    P = len(plans)
    net = netmodel.Network.of(hw, plans[0].world_size)
    counts = np.array([chunk_layers(layers, p) for p in plans], dtype=float)  # plans x chunks
    first = np.zeros(chunks)
    first[0] = 1
    last = np.zeros(chunks)
    last[-1] = 1
    cost = [costs[layer_key(p)] for p in plans]
    per_chunk = {}
    for f in _FIELDS:
        layer = np.array([getattr(c.layer, f) for c in cost], dtype=float)
        head = np.array([getattr(c.first, f) for c in cost], dtype=float)
        end = np.array([getattr(c.last, f) for c in cost], dtype=float)
        per_chunk[f] = counts * layer[:, None] + head[:, None] * first + end[:, None] * last
    stage_of = np.zeros((chunks, pp))
    stage_of[np.arange(chunks), np.arange(chunks) % pp] = 1
    per_stage = {f: per_chunk[f] @ stage_of for f in _FIELDS}
    zero = np.array([p.zero for p in plans])
    shard = np.array([max(1, p.dp * p.cp) for p in plans], dtype=float)[:, None]

    def sharded(cond):
        return np.where(cond[:, None], shard, 1.0)

    static = (per_stage["params"] / sharded(zero == 3) + per_stage["grads"] / sharded(zero >= 2)
              + per_stage["optimizer"] / sharded(zero >= 1))
    memory = (static + _activation_peak(_walk(order, pp, m, vp), per_chunk["activations"])).max(axis=1)
    out.memory[idx] = memory
    keep = np.flatnonzero(memory <= capacity)
    if len(keep) == 0 or not times:
        return
    if len(keep) < P:  # the plans that fit, from here on
        plans, idx, counts, cost = [plans[k] for k in keep], idx[keep], counts[keep], [cost[k] for k in keep]
        per_chunk = {f: v[keep] for f, v in per_chunk.items()}
        per_stage = {f: v[keep] for f, v in per_stage.items()}
        zero, shard = zero[keep], shard[keep]
        P = len(plans)
    adam = per_stage["adam_ns"] / sharded(zero >= 1)
    F, B = per_chunk["fwd_ns"].copy(), per_chunk["bwd_ns"].copy()
    send = np.zeros(P)
    tail = adam.copy()
    # gradient buckets fill the compute between the last backward steps' collectives
    hide = WINDOW_USE * ((per_chunk["bwd_ns"] - per_chunk["bwd_comm_ns"]) @ stage_of)
    for j, plan in enumerate(plans):
        c = cost[j]
        dpcp = plan.dp * plan.cp
        if pp > 1:
            send[j] = net.message_ns(0, _mesh(plan).peer(0, "pp+1"), c.send_bytes)
        if plan.zero == 3 and dpcp > 1:  # parameters gathered over dp x cp before each use, forward and backward
            layer = _layer_gathered(net, hw, plan, c, dpcp)
            # a chunk's first layer has no layer before it to prefetch in: its gather is in the open
            extra = counts[j][:, None] * layer + (_gathered(net, plan, c.layer.params, dpcp) - layer)
            # so is what lies outside the layers (the embedding, the head), gathered first
            if chunks == 1:
                extra[0] += _gathered(net, plan, c.first.params + c.last.params, dpcp)
            else:
                extra[0] += _gathered(net, plan, c.first.params, dpcp)
                extra[-1] += _gathered(net, plan, c.last.params, dpcp)
            F[j] += extra[:, 0]
            B[j] += extra[:, 1]
            # the gathers hold the communication slot through the backward: the gradient
            # buckets find that much of the windows taken
            gathers = counts[j] * _gathered(net, plan, c.layer.params, dpcp)
            gathers[0] += _gathered(net, plan, c.first.params, dpcp)
            gathers[-1] += _gathered(net, plan, c.last.params, dpcp)
            hide[j] = np.maximum(0.0, hide[j] - gathers @ stage_of)
        if dpcp <= 1:
            continue
        for s in range(pp):
            elements = per_stage["grad_elements"][j, s]
            reduce_ns, last_bucket = _dp_reduce(net, plan, elements)
            exposed = max(reduce_ns - hide[j, s], last_bucket) if reduce_ns else 0.0
            gathers = 0.0
            if plan.zero in (1, 2):  # the updated shards go back to every replica
                gathers = _bucketed(net, "all_gather", plan, elements // dpcp * 2)
            buckets = max(1, -(-int(elements) // max(40_000_000, 1_000_000 * plan.dp)))
            # each bucket's kernel, then its gather: a flow of two resources
            a = adam[j, s]
            tail[j, s] = exposed + max(a + gathers / buckets, a / buckets + gathers)
    fg = np.array([c.foreground for c in cost])
    end = _pipeline(_shape(order, pp, m, vp), F, B, send, fg, pp)
    finish = end + tail
    rows = np.arange(P)
    busiest = np.argmax(finish, axis=1)
    compute = m * ((per_chunk["fwd_ns"] + per_chunk["bwd_ns"]) @ stage_of) + adam
    out.step_ns[idx] = finish.max(axis=1)
    out.compute_ns[idx] = compute[rows, busiest]
    out.exposed_comm_ns[idx] = out.step_ns[idx] - out.compute_ns[idx]  # waits of every kind
    out.model_flops[idx] = m * per_chunk["model_flops"].sum(axis=1) / pp


def _gathered(net: netmodel.Network, plan: Plan, params: int, dpcp: int) -> float:
    """The gather of ``params`` bytes over dp x cp (ZeRO-3), in the open."""
    if params <= 0:
        return 0.0
    key = (net, "gather", _mesh_key(plan), params)
    got = _MOVES.get(key)
    if got is None:
        got = _MOVES[key] = net.collective_ns("all_gather", -(-params // dpcp), _dp_group(plan))
    return got


def _layer_gathered(net: netmodel.Network, hw: HardwareSpec, plan: Plan, c: LayerCosts, dpcp: int) -> np.ndarray:
    """What a layer's parameter gather adds to the forward and the backward of the layer
    before it (one layer of prefetch), placed as :mod:`stage_core.parallel.overlap` places
    it: pieces sized by the textbook estimate to 80% of each window, none under 1 MiB,
    the rest after the last foreground communication; a piece the network takes longer
    over than its window delays the step, and the rest is exposed beyond the compute
    after that last communication."""
    key = (id(c), _mesh_key(plan), hw.name)
    got = _GATHERED.get(key)
    if got is not None and got[0] is c:
        return got[1]
    group = _dp_group(plan)
    link = hardware.tier(hw, group)
    n = len(group)
    total = -(-c.layer.params // dpcp)
    unit = 4 * n
    out = []
    for windows in (c.fwd_windows, c.bwd_windows):
        left, extra = total, 0.0
        for usable in windows.usable:
            if left <= 0:
                break
            # hardware.transfer_bytes, with the group's link looked up once
            fixed = hardware.RING_STEPS["all_gather"](n) * hardware.LINKS_PER_HOP * link.latency_ns * 1e-9
            fits = max(0, int((WINDOW_USE * usable * 1e-9 - fixed) * link.bytes_per_second
                              / hardware.RING_FACTOR["all_gather"](n)))
            size = min(left, fits // unit * unit)
            if size <= 0 or (size < MIN_PIECE_BYTES and size < left):
                continue
            extra += max(0.0, net.collective_ns("all_gather", size, group) - usable / WINDOW_USE)
            left -= size
        if left > 0:
            extra += max(0.0, net.collective_ns("all_gather", left, group) - windows.tail)
        out.append(extra)
    result = np.array(out)
    _GATHERED[key] = (c, result)
    return result


_MESHES: dict[tuple, Mesh] = {}
_GROUPS: dict[tuple, tuple[int, ...]] = {}
_GATHERED: dict[tuple, tuple] = {}
_MOVES: dict[tuple, float] = {}


def _mesh_key(plan: Plan) -> tuple:
    return (plan.tp, plan.cp, plan.dp, plan.pp, plan.ep, plan.etp, plan.order)


def _mesh(plan: Plan) -> Mesh:
    key = _mesh_key(plan)
    mesh = _MESHES.get(key)
    if mesh is None:
        mesh = _MESHES[key] = Mesh.from_plan(plan)
    return mesh


def _dp_group(plan: Plan) -> tuple[int, ...]:
    """The ranks of rank 0's gradient group (cp and dp), as comm_groups.json lists them."""
    key = _mesh_key(plan)
    got = _GROUPS.get(key)
    if got is None:
        got = _GROUPS[key] = tuple(_mesh(plan).group_members("cp+dp" if plan.cp > 1 else "dp", 0))
    return got


def _bucketed(net: netmodel.Network, kind: str, plan: Plan, nbytes: float) -> float:
    """``nbytes`` moved as Megatron's buckets (max(40M, 1M x dp) parameters of 2 bytes)."""
    if nbytes <= 0:
        return 0.0
    key = (net, kind, _mesh_key(plan), int(nbytes))
    got = _MOVES.get(key)
    if got is None:
        bucket = max(40_000_000, 1_000_000 * plan.dp) * 2
        full, rest = divmod(int(nbytes), bucket)
        group = _dp_group(plan)
        got = full * net.collective_ns(kind, bucket, group) if full else 0
        got = _MOVES[key] = got + (net.collective_ns(kind, rest, group) if rest else 0)
    return got


def _dp_reduce(net: netmodel.Network, plan: Plan, elements: float) -> tuple[float, float]:
    """(the whole reduction, its last bucket) of a stage's gradients, ns."""
    if plan.dp * plan.cp <= 1 or elements <= 0:
        return 0.0, 0.0
    kind = "reduce_scatter" if plan.zero >= 2 else "all_reduce"
    key = (net, kind, _mesh_key(plan), plan.grad_dtype, int(elements))
    got = _MOVES.get(key)
    if got is None:
        nbytes = elements * DTYPE_BYTES[plan.grad_dtype]
        bucket = max(40_000_000, 1_000_000 * plan.dp) * DTYPE_BYTES[plan.grad_dtype]
        total = _bucketed(net, kind, plan, nbytes)
        last = net.collective_ns(kind, int(min(bucket, nbytes)), _dp_group(plan))
        got = _MOVES[key] = (float(total), float(last))
    return got


# --------------------------------------------------------------------------- the pipeline


@dataclass(frozen=True)
class Shape:
    """A schedule's steps as a dependency graph, in rounds: a round holds at most one step
    of each stage, every step after its stage's previous one and after the step it waits
    for, so that a round is evaluated for all its stages (and plans) at once."""

    #: per round: stages, columns, step ids, (every step waits for another, some do), the
    #: steps they wait for, 1 where a message comes between, -inf where nothing is waited
    #: for, and which of the round's steps send
    rounds: list[tuple]
    steps: int


@lru_cache(maxsize=512)
def _shape(order, pp: int, m: int, vp: int) -> Shape:
    stages = order(pp, m, vp)
    K = len(stages[0])
    if any(len(st) != K for st in stages):
        raise ValueError(f"schedule order for pp {pp} gives the stages different step counts")
    chunks = pp * vp
    kind = np.array([[k == "B" for k, _, _ in st] for st in stages])  # pp x K
    mb = np.array([[b for _, b, _ in st] for st in stages])
    g = np.array([[v * pp + s for _, _, v in st] for s, st in enumerate(stages)])
    key = (kind * m + mb) * chunks + g  # a step as one integer: forwards first, then backwards
    flat = np.full(2 * m * chunks, -1, dtype=np.int64)
    flat[key.ravel()] = np.arange(pp * K)
    # what each step waits for on another stage (or, for the last chunk's backward, its own forward)
    dep_key = np.where(kind, np.where(g < chunks - 1, ((m + mb) * chunks + g + 1), mb * chunks + g),
                       np.where(g > 0, mb * chunks + g - 1, -1))
    dep = np.where(dep_key >= 0, flat[np.maximum(dep_key, 0)], -1).ravel()
    remote = np.where(kind, g < chunks - 1, g > 0).ravel()
    sends = np.where(kind, g > 0, g < chunks - 1).ravel()
    # rounds: each step after its stage's previous one and after the step it waits for
    steps = np.arange(K)
    rnd = np.tile(steps, pp)
    has = dep >= 0
    for _ in range(pp * K + 1):
        before = rnd.copy()
        rnd[has] = np.maximum(rnd[has], rnd[dep[has]] + 1)
        per_stage = rnd.reshape(pp, K)
        rnd = (np.maximum.accumulate(per_stage - steps, axis=1) + steps).ravel()
        if np.array_equal(rnd, before):
            break
    else:
        raise ValueError(f"schedule order for pp {pp}, {m} micro-batches, {vp} virtual stages never completes")
    stage = np.repeat(np.arange(pp), K)
    column = np.where(kind, chunks + g, g).ravel()
    order_ = np.argsort(rnd, kind="stable")
    cuts = np.flatnonzero(np.diff(rnd[order_])) + 1
    rounds = []
    for i in np.split(order_, cuts):
        waits = dep[i] >= 0
        rounds.append((stage[i], column[i], i, waits.all(), waits.any(), np.maximum(dep[i], 0),
                       np.where(waits, remote[i], 0.0), np.where(waits, 0.0, -np.inf), np.flatnonzero(sends[i])))
    return Shape(rounds, pp * K)


@lru_cache(maxsize=512)
def _walk(order, pp: int, m: int, vp: int) -> tuple[np.ndarray, np.ndarray]:
    """Per stage, the chunk of each of its steps in order, and +1 for a forward (its
    activations kept), -1 for a backward (freed)."""
    stages = order(pp, m, vp)
    chunks = np.array([[v * pp + s for _, _, v in st] for s, st in enumerate(stages)])
    sign = np.array([[1.0 if k == "F" else -1.0 for k, _, _ in st] for st in stages])
    return chunks, sign


def _pipeline(shape: Shape, F, B, send, fg, pp):
    """When each stage's last step ends (per plan)."""
    P = F.shape[0]
    dur = np.concatenate([F, B], axis=1)  # columns: forward of each chunk, then backward
    end = np.zeros((P, shape.steps))
    free = np.zeros((P, pp))  # the compute of each stage
    slot = np.zeros((P, pp))  # the communication slot of each stage, after its last send
    fgf = fg.astype(float)[:, None]
    sendc = send[:, None]
    for stage, column, ident, every, some, dep, remote, none, sends in shape.rounds:
        ready = free[:, stage]
        if some:
            arrive = end[:, dep] + sendc * remote
            ready = np.maximum(ready, arrive if every else arrive + none)
        finish = np.maximum(ready, slot[:, stage] * fgf) + dur[:, column]
        end[:, ident] = finish
        free[:, stage] = finish
        if len(sends):
            slot[:, stage[sends]] = finish[:, sends] + sendc
    return free


def _activation_peak(walk, act):
    """Per stage, the activations of the micro-batches in flight at the worst point of its order."""
    chunks, sign = walk
    live = np.cumsum(act[:, chunks] * sign, axis=2)  # plans x stages x steps
    return np.maximum(live.max(axis=2), 0.0)
