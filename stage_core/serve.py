"""Disaggregated serving (DistServe, Splitwise, DeepSeek's deployment): prefill and decode
on two groups of ranks, in one trace set.

    stage generate --task serve --prefill-ranks P --decode-ranks D \\
        [--prefill-plan tp=4,pp=2] [--decode-plan tp=8,micro-batch-size=64] ...

Ranks 0..P-1 run one prefill step of their plan; ranks P..P+D-1 run the decode steps of
theirs.  Each side's plan is the main flags (--tp, --pp, --cp, --ep, --micro-batch-size,
--micro-batches) with the side's ``KEY=VALUE`` list over them; its dp is its ranks over
tp·cp·pp unless the list gives it.  When --dp is given the main flags name a world
(tp·cp·dp·pp) and the split must add up to it.  Prefill takes --seq-len (the prompts);
decode takes --context-len (default: the prompt and the first generated token, seq-len
+ 1) and --decode-steps.

The requests the prefill step handles join the decode batch: request q (prefill replica
r, its u-th request: q = r·U + u) goes to decode replica q mod dp_d, which must have room
for them.  Every prompt's KV cache goes from the prefill ranks that hold it to the decode
ranks that will hold it, as one send/recv pair per request and pair of ranks, sized by
the part of the cache they share: the layers both hold, the overlap of their slices of
each sharded dim (heads under tp), the prompt's tokens (a CP rank its part).  Where the
prefill side keeps several copies (MLA's latent under tp), the decode ranks take turns
among them.  A prefill rank sends a micro-batch's caches once its step has run them; a
decode micro-batch starts once its new requests' caches have arrived (the other
requests of its batch are already there).

Programs are per rank here (the transfers differ rank by rank): prefill programs end
with their sends (chained in the one communication slot after everything else), decode
programs start with their receives.
"""

from __future__ import annotations

from collections import Counter

from dataclasses import dataclass, field, replace
from typing import Mapping

from . import __version__
from .bounds import MAX_WORLD
from .errors import UsageError
from .parallel.mesh import Mesh
from .parallel.plan import Plan, is_count
from .tasks import DECODE, PREFILL, SERVE
from .trace import NodeType, ProgramNode, RankProgram, TraceJob

#: what a side's --prefill-plan / --decode-plan list may set (its own values, over the main flags)
SIDE_KEYS = {"tp": int, "pp": int, "dp": int, "cp": int, "ep": int, "etp": int, "micro-batch-size": int,
             "micro-batches": int, "cp-comm": str, "moe-dispatcher": str}
#: KV-cache messages' tags: above any pipeline tag of either side
KV_TAG = 1 << 24
#: the peer key of a KV message: an absolute rank
PEER = "rank:"


@dataclass
class ServeResult:
    """The two sides planned, and the job that holds both."""

    prefill: object  # api.Result
    decode: object
    job: TraceJob
    manifest: dict
    config: object
    plan: Plan
    transfers: list = field(default_factory=list)  # (prefill rank, decode rank, request, bytes)


# --------------------------------------------------------------------------- the two plans
def parse_side(text: str | None, flag: str) -> dict:
    """``"tp=4,pp=2"`` -> {"tp": 4, "pp": 2}; one line naming the bad part otherwise."""
    out: dict = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in SIDE_KEYS:
            raise UsageError(f"{flag} {text}: expected KEY=VALUE pairs separated by commas, KEY one of "
                             f"{', '.join(SIDE_KEYS)} (e.g. tp=4,pp=2)")
        if key.replace("-", "_") in out:  # (the last one would silently win)
            raise UsageError(f"{flag} {text}: {key} is given twice; give each key once")
        if SIDE_KEYS[key] is int:
            try:
                value = int(value)
            except ValueError:
                value = None
            if not is_count(value):
                raise UsageError(f"{flag} {text}: {key} must be a positive integer")
        out[key.replace("-", "_")] = value
    return out


def side_plans(base: Plan, prefill_ranks: int | None, decode_ranks: int | None, prefill: dict, decode: dict,
               world: int | None) -> tuple[Plan, Plan]:
    """The prefill and decode plans of ``--task serve`` (see the module docstring)."""
    for value, flag in ((prefill_ranks, "--prefill-ranks"), (decode_ranks, "--decode-ranks")):
        if value is None:
            raise UsageError(f"--task serve needs {flag} (and its partner): the ranks that run each side")
        if not is_count(value):
            raise UsageError(f"{flag} {value}: must be a positive integer")
    if prefill_ranks + decode_ranks > MAX_WORLD:  # before anything is laid out per rank
        raise UsageError(f"--prefill-ranks {prefill_ranks:,} + --decode-ranks {decode_ranks:,} = "
                         f"{prefill_ranks + decode_ranks:,} ranks, above the {MAX_WORLD:,} STAGE lays out")
    if world is not None and prefill_ranks + decode_ranks != world:
        raise UsageError(f"--prefill-ranks {prefill_ranks} + --decode-ranks {decode_ranks} = "
                         f"{prefill_ranks + decode_ranks} does not add up to the world of {world} ranks "
                         f"(tp x cp x dp x pp); give a split that does, e.g. --prefill-ranks "
                         f"{max(1, world // 4)} --decode-ranks {world - max(1, world // 4)}")
    if decode.get("cp", 1) > 1:
        raise UsageError(f"--decode-plan cp={decode['cp']}: context parallel splits long prompts; it applies to "
                         f"the prefill side only")
    common = base.replace(task=PREFILL, context_len=None, decode_steps=1)
    pre = _side(common.replace(seq_len=base.seq_len), prefill, prefill_ranks, "--prefill")
    dec = _side(common.replace(task=DECODE, cp=1, seq_len=None, context_len=base.context_len,
                               decode_steps=base.decode_steps), decode, decode_ranks, "--decode")
    return pre, dec


def _side(plan: Plan, given: dict, ranks: int, flag: str) -> Plan:
    plan = plan.replace(**given)
    per_replica = plan.tp * plan.cp * plan.pp
    dp = given.get("dp")
    if dp is None:
        if ranks % per_replica:
            valid = ", ".join(str(per_replica * k) for k in range(1, 5))
            raise UsageError(f"{flag}-ranks {ranks}: the {flag[2:]} plan (tp {plan.tp} x cp {plan.cp} x pp "
                             f"{plan.pp}) needs a multiple of {per_replica} ranks; valid {flag}-ranks: {valid}, ...")
        dp = ranks // per_replica
    if per_replica * dp != ranks:
        raise UsageError(f"{flag}-plan dp={dp}: tp {plan.tp} x cp {plan.cp} x dp {dp} x pp {plan.pp} = "
                         f"{per_replica * dp} ranks, but {flag}-ranks is {ranks}")
    return plan.replace(dp=dp)


# --------------------------------------------------------------------------- the job
def plan_serve(host, model: str, overrides: Mapping[str, str] | None, prefill: Plan, decode: Plan,
               gpu=None) -> ServeResult:
    """Both sides planned (api.plan_job each), the KV caches routed, one job for both."""
    from .flow import plan_job

    routes = route(prefill, decode)  # before any work
    pre = plan_job(host, model, overrides, prefill, gpu)
    if decode.context_len is None:  # the prompt, then the first new token
        decode = decode.replace(context_len=pre.plan.seq_len + 1)
        most = pre.forward.meta.get("max_positions")
        last = decode.context_len + decode.decode_steps - 1
        if most and last > most:
            raise UsageError(f"--seq-len {pre.plan.seq_len}: decoding after the prompt reaches position {last}, "
                             f"beyond the {most} positions of {pre.config.name}; give --seq-len at most "
                             f"{most - decode.decode_steps}")
    if decode.context_len <= pre.plan.seq_len:
        raise UsageError(f"--context-len {decode.context_len}: the decode side starts after the prompt of "
                         f"--seq-len {pre.plan.seq_len} and its first token; give at least {pre.plan.seq_len + 1}")
    dec = plan_job(host, model, overrides, decode, gpu)
    transfers = kv_transfers(pre, dec, routes)
    job = merge_jobs(pre, dec, transfers, routes)
    manifest = serve_manifest(pre, dec, transfers, routes, job.world_size)
    job.manifest = manifest
    return ServeResult(pre, dec, job, manifest, pre.config, pre.plan.replace(task=SERVE), transfers)


@dataclass(frozen=True)
class Routes:
    """Which decode replica and micro-batch each prefilled request joins."""

    per_prefill_replica: int  # requests one prefill replica handles (U)
    requests: int
    decode_replica: dict[int, int]  # request -> decode replica
    decode_micro_batch: dict[int, int]  # request -> its micro-batch there


def route(p: Plan, d: Plan) -> Routes:
    """Where the prefill plan ``p``'s requests go on the decode plan ``d``'s replicas."""
    per = p.micro_batch_size * p.micro_batches
    total = per * p.dp
    room = d.micro_batch_size * d.micro_batches
    if total % d.dp:
        raise UsageError(f"the prefill step's {total} requests (dp {p.dp} x {per}) must split evenly over the "
                         f"{d.dp} decode replicas; give a decode dp that divides {total}")
    if total // d.dp > room:
        raise UsageError(f"each decode replica would receive {total // d.dp} new requests but holds "
                         f"{room} (micro-batch size {d.micro_batch_size} x {d.micro_batches}); raise the decode "
                         f"batch or lower the prefill batch")
    replica = {q: q % d.dp for q in range(total)}
    micro = {q: (q // d.dp) // d.micro_batch_size for q in range(total)}
    return Routes(per, total, replica, micro)


def _slice(size: int, axes: tuple[str, ...], mesh: Mesh, rank: int) -> tuple[int, int]:
    """The part [start, stop) of a dim of ``size`` that ``rank`` holds, sharded over ``axes``."""
    start, length = 0, size
    for a in axes:
        n = mesh.degrees.get(a, 1)
        length //= n
        start += mesh.coord(rank, a) * length
    return start, start + length


def kv_transfers(pre, dec, routes: Routes) -> list[tuple[int, int, int, int]]:
    """(prefill rank, decode rank, request, bytes): each request's cache, pair by pair."""
    mp, md = Mesh.from_plan(pre.plan), Mesh.from_plan(dec.plan)
    cp_, cd = pre.lowered.caches, dec.lowered.caches
    amount: dict[tuple[int, int, int], int] = {}
    pre_ranks = {}  # (replica, stage) -> prefill ranks
    for r in range(mp.world_size):
        pre_ranks.setdefault((mp.coord(r, "dp"), mp.coord(r, "pp")), []).append(r)
    dec_ranks = {}
    for r in range(md.world_size):
        dec_ranks.setdefault((md.coord(r, "dp"), md.coord(r, "pp")), []).append(r)
    for name, lp in cp_.items():
        ld = cd[name]
        dims = [i for i in range(len(lp.sizes)) if i not in (0, lp.seq_dim)]  # b is routed; the prompt is whole
        for q in range(routes.requests):
            r_p, r_d = q // routes.per_prefill_replica, routes.decode_replica[q]
            senders = pre_ranks[(r_p, lp.stage)]
            receivers = dec_ranks[(r_d, ld.stage)]
            for k, d_rank in enumerate(receivers):
                want = {i: _slice(ld.sizes[i], ld.shards[i], md, d_rank) for i in dims}
                holders: dict[tuple, list[int]] = {}
                for p_rank in senders:
                    have = {i: _slice(lp.sizes[i], lp.shards[i], mp, p_rank) for i in dims}
                    overlap = 1
                    for i in dims:
                        overlap *= max(0, min(have[i][1], want[i][1]) - max(have[i][0], want[i][0]))
                    if overlap:
                        # a recurrent state (no sequence dim) goes over whole, once
                        tokens = 1 if lp.seq_dim is None else lp.sizes[lp.seq_dim] // _slice_count(
                            lp.shards[lp.seq_dim], mp)
                        key = (tuple(sorted(have.items())), _seq_part(lp, mp, p_rank))
                        holders.setdefault(key, []).append((p_rank, overlap * tokens * lp.itemsize))
                for copies in holders.values():  # several copies of one slice: the receivers take turns
                    p_rank, nbytes = copies[k % len(copies)]
                    amount[(p_rank, d_rank, q)] = amount.get((p_rank, d_rank, q), 0) + nbytes
    return [(p, d, q, n) for (p, d, q), n in sorted(amount.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1]))]


def _slice_count(axes: tuple[str, ...], mesh: Mesh) -> int:
    n = 1
    for a in axes:
        n *= mesh.degrees.get(a, 1)
    return n


def _seq_part(layout, mesh: Mesh, rank: int) -> tuple:
    """Which part of the prompt ``rank`` caches (a CP rank its own; otherwise all of it)."""
    if layout.seq_dim is None:  # a recurrent state: no part of the prompt
        return ()
    return tuple(mesh.coord(rank, a) for a in layout.shards[layout.seq_dim])


# --------------------------------------------------------------------------- programs
def merge_jobs(pre, dec, transfers, routes: Routes) -> TraceJob:
    P = pre.job.world_size
    programs: list[RankProgram] = []
    sends: dict[int, list] = {}
    recvs: dict[int, list] = {}
    mp = Mesh.from_plan(pre.plan)
    for p, d, q, n in transfers:
        sends.setdefault(p, []).append((P + d, q, n))
        recvs.setdefault(d, []).append((p, q, n))
    pre_spans, dec_spans = pre.lowered.spans, dec.lowered.spans
    for program in pre.job.programs:
        stage = mp.coord(program.ranks[0], "pp")
        for r in program.ranks:
            programs.append(RankProgram((r,), _with_sends(program.nodes, sends.get(r, []), pre_spans[stage],
                                                          routes.per_prefill_replica, pre.plan.micro_batch_size),
                                        label=f"prefill.{program.label}"))
    md = Mesh.from_plan(dec.plan)
    for program in dec.job.programs:
        stage = md.coord(program.ranks[0], "pp")
        for r in program.ranks:
            programs.append(RankProgram((P + r,), _with_recvs(program.nodes, recvs.get(r, []), dec_spans[stage],
                                                              routes),
                                        label=f"decode.{program.label}"))
    offset = max((int(name) for name in pre.job.comm_groups), default=0)
    groups = {**{k: list(v) for k, v in pre.job.comm_groups.items()},
              **{str(int(k) + offset): [P + r for r in v] for k, v in dec.job.comm_groups.items()}}

    def group_name(rank: int, key: str) -> str:
        if rank < P:
            return pre.job.group_name(rank, key)
        return str(int(dec.job.group_name(rank - P, key)) + offset)

    def peer_rank(rank: int, key: str) -> int:
        if key.startswith(PEER):
            return int(key[len(PEER):])
        if rank < P:
            return pre.job.peer_rank(rank, key)
        return P + dec.job.peer_rank(rank - P, key)

    return TraceJob(programs=programs, world_size=P + dec.job.world_size, comm_groups=groups,
                    group_name=group_name, peer_rank=peer_rank, name=pre.job.name)


def _with_sends(nodes, sends, spans, per_replica: int, mbs: int) -> tuple[ProgramNode, ...]:
    """A prefill rank's program, then its KV sends: each after its micro-batch's step on
    this stage, all in the one communication slot after the program's own."""
    out = list(nodes)
    last_of = {}
    for j, m, c, first, last in spans:
        last_of[m] = max(last_of.get(m, -1), last)
    slot = next((n.id for n in reversed(nodes) if n.type in (NodeType.COMM_SEND, NodeType.COMM_COLL)), None)
    for dst, q, n in sends:
        m = (q % per_replica) // mbs
        nid = len(out)
        ctrl = (slot,) if slot is not None and slot != last_of[m] else ()
        out.append(ProgramNode(nid, f"kv:send:request{q}", NodeType.COMM_SEND, (last_of[m],), ctrl, comm_size=n,
                               peer=f"{PEER}{dst}", tag=KV_TAG + q))
        slot = nid
    return tuple(out)


def _with_recvs(nodes, recvs, spans, routes: Routes) -> tuple[ProgramNode, ...]:
    """A decode rank's receives, then its program (ids shifted): the first step of a
    micro-batch waits for the caches of the requests that join it."""
    shift = len(recvs)
    head = []
    waits: dict[int, list[int]] = {}
    for i, (src, q, n) in enumerate(recvs):
        head.append(ProgramNode(i, f"kv:recv:request{q}", NodeType.COMM_RECV, comm_size=n, peer=f"{PEER}{src}",
                                tag=KV_TAG + q))
        waits.setdefault(routes.decode_micro_batch[q], []).append(i)
    starts = {first: waits.get(m, []) for j, m, c, first, last in spans if j == 0}
    out = head
    for node in nodes:
        ctrl = tuple(d + shift for d in node.ctrl_deps) + tuple(starts.get(node.id, ()))
        out.append(_moved(node, shift, ctrl))
    return tuple(out)


def _moved(node: ProgramNode, shift: int, ctrl: tuple[int, ...]) -> ProgramNode:
    return replace(node, id=node.id + shift, data_deps=tuple(d + shift for d in node.data_deps),
                   ctrl_deps=tuple(sorted(set(ctrl))))


# --------------------------------------------------------------------------- manifest
def _with_transfers(classes: list[dict], side: str, offset: int, extra) -> list[dict]:
    """A side's rank classes with their KV transfers counted: ``extra(rank)`` gives the
    (nodes, bytes sent, bytes received) the transfers add to a rank, and the ranks of a
    class to which they add alike stay one class (so the manifest says what each file holds)."""
    out = []
    for rc in classes:
        groups: dict[tuple, list[int]] = {}
        for r in rc["ranks"]:
            groups.setdefault(extra(r), []).append(r)
        for (nodes, sent, received), ranks in groups.items():
            comm = dict(rc["comm_bytes"], send=rc["comm_bytes"]["send"] + sent,
                        recv=rc["comm_bytes"]["recv"] + received)
            wire = rc.get("wire_bytes")
            if wire is not None:
                wire = {"wire_bytes": dict(wire, send=wire["send"] + sent, recv=wire["recv"] + received)}
            out.append({**rc, "side": side, "ranks": [offset + r for r in ranks], "comm_bytes": comm,
                        **(wire or {}), "nodes": rc["nodes"] + nodes})
    return out


def serve_manifest(pre, dec, transfers, routes: Routes, world: int) -> dict:
    P = pre.job.world_size
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    for p, d, q, n in transfers:
        sent[p] = sent.get(p, 0) + n
        received[d] = received.get(d, 0) + n
    per_request: dict[int, int] = {}
    for p, d, q, n in transfers:
        per_request[q] = per_request.get(q, 0) + n
    sends = Counter(p for p, d, q, n in transfers)
    recvs = Counter(d for p, d, q, n in transfers)
    classes = _with_transfers(pre.manifest["rank_classes"], PREFILL, 0, lambda r: (sends[r], sent.get(r, 0), 0))
    classes += _with_transfers(dec.manifest["rank_classes"], DECODE, P, lambda r: (recvs[r], 0, received.get(r, 0)))
    out = {
        "stage_version": __version__,
        "format": pre.manifest["format"],
        "units": pre.manifest["units"],
        "model": pre.manifest["model"],
        "plan": {"task": SERVE, "prefill_ranks": P, "decode_ranks": dec.job.world_size,
                 "prefill": pre.manifest["plan"], "decode": dec.manifest["plan"]},
        "world_size": world,
        "rank_classes": classes,
        "inference": {"prefill": pre.manifest["inference"], "decode": dec.manifest["inference"]},
        "kv_transfer": {"requests": routes.requests, "messages": len(transfers),
                        "bytes": sum(n for *_, n in transfers),
                        "bytes_per_request": max(per_request.values(), default=0),
                        "max_sent_per_prefill_rank": max(sent.values(), default=0),
                        "max_received_per_decode_rank": max(received.values(), default=0)},
    }
    for key in ("hardware", "compute_model", "kernel_times"):
        if key in pre.manifest:
            out[key] = pre.manifest[key]
    return out

