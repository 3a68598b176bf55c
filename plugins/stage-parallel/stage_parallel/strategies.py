"""Each strategy states placements and checks degrees; no strategy writes a collective.

The collectives follow from these facts in the core's propagation
(stage_core.parallel.propagate): a sharded batch dim contracted by a weight
gradient becomes Partial and reduces in the gradient sync; a weight sharded on
its output features makes its einsum column parallel, on its input features row
parallel, and the Partial result is all-reduced (or reduce-scattered under
sequence parallel) where the residual stream wants it.
"""

from __future__ import annotations

from stage_core.api import FLAT, Mesh, Replicate, Shard, ShardedGraph, divisors, expert_tensors

from .stages import balanced_split, layer_weights

#: dims tensor parallel shards, first match per parameter: query groups (Megatron
#: shards attention by KV group so each rank keeps whole groups), heads where a
#: layer has no groups (MLA), a Mamba layer's SSM groups (each rank keeps whole
#: groups of B and C with their heads, as Megatron's MambaMixer does), the FFN
#: widths, the vocabulary.  The routed experts' weights are the expert view's (ep,
#: etp), not tp's.  A model lists more in ``graph.meta["tp_dims"]`` (a CNN's channel
#: dims, one of each convolution's two), matched before these.
TP_DIMS = ("g", "a", "mg", "f", "fs", "V")
#: how tensor parallel runs convolutions (--tp-convs): split their channels, or split their
#: images over the tp ranks too while the fully connected layers stay model parallel (Das et
#: al. 2016's hybrid, Krizhevsky 2014's "one weird trick")
TP_CONVS = ("channels", "data")
CONV_KERNELS = ("conv2d",)


def tp_dims(graph, plan) -> tuple[str, ...]:
    """The dims tp shards on this model: the model's declared ones (``graph.meta["tp_dims"]``)
    then the standard names; with ``--tp-convs data`` only the standard ones (the fully
    connected layers')."""
    declared = () if plan.option("tp-convs", "channels") == "data" else tuple(graph.meta.get("tp_dims", ()))
    return tuple(dict.fromkeys(declared + TP_DIMS))


def conv_params(graph) -> set:
    """The parameters of convolutions and of what runs on their channels (BatchNorm)."""
    out = set()
    for op in graph.ops:
        if op.fn in CONV_KERNELS or op.fn == "batchnorm":
            out.update(t for t in op.inputs if t in set(graph.params))
    return out


def _need_divides(what: str, flag: str, degree: int, dims: dict, names) -> list[str]:
    """One message naming every dim ``degree`` fails to divide, and the degrees that divide them all."""
    sizes = {name: dims[name] for name in names if dims.get(name) is not None}
    bad = {name: v for name, v in sizes.items() if v % degree}
    if not bad:
        return []
    common = [d for d in divisors(min(sizes.values())) if all(v % d == 0 for v in sizes.values())]
    failing = ", ".join(f"{name} = {v}" for name, v in bad.items())
    return [f"{flag} {degree}: {what} needs it to divide {failing}; valid {flag}: {', '.join(map(str, common))}"]


# --------------------------------------------------------------------------- dp


def validate_dp(graph, plan) -> list[str]:
    return []


def apply_dp(sg: ShardedGraph, mesh, plan) -> ShardedGraph:
    sg.shard_inputs("dp", "b")  # each replica gets its own sequences
    sg.grad_target["dp"] = Replicate()  # gradients all-reduced once per step
    return sg


# --------------------------------------------------------------------------- tp


def validate_tp(graph, plan) -> list[str]:
    if plan.option("tp-convs", "channels") == "data":
        if not conv_params(graph):
            return [f"--tp-convs data: splits the images of convolutions over tp; {graph.name} has no convolution"]
        if plan.micro_batch_size % plan.tp:
            valid = [str(d) for d in divisors(plan.micro_batch_size)]
            return [f"--tp-convs data: the convolutions split each micro-batch's {plan.micro_batch_size} images over "
                    f"--tp {plan.tp}; valid --tp: {', '.join(valid)}"]
    if plan.tp == 1:
        return []
    return _need_divides("tensor parallel", "--tp", plan.tp, graph.dims, tp_dims(graph, plan))


def apply_tp(sg: ShardedGraph, mesh, plan) -> ShardedGraph:
    if plan.tp == 1:
        return sg
    experts = expert_tensors(sg.graph)
    if plan.option("tp-convs", "channels") == "data":
        # Das et al. 2016: convolutions data parallel over every rank (their images split over
        # tp too; their weight gradients, Partial over tp, reduced after the dp sync), the
        # fully connected layers model parallel over tp (their input gathered over tp)
        convs = conv_params(sg.graph)
        sg.shard_inputs("tp", "b")
        sg.shard_params("tp", TP_DIMS, where=lambda p: p not in experts and p not in convs)
    else:
        sg.shard_params("tp", tp_dims(sg.graph, plan), where=lambda p: p not in experts)
    if not plan.sp:
        sg.hint("residual", "tp", Replicate())  # the residual stream is whole on every TP rank
    return sg


# --------------------------------------------------------------------------- sp


def validate_sp(graph, plan) -> list[str]:
    if not plan.sp:
        return []
    if not any(getattr(d, "name", None) == "s" for t in graph.inputs for d in t.shape):
        return [f"--sp: sequence parallel splits the sequence over tp; {graph.name} has no sequence dim (an image "
                f"model); leave --sp out"]
    if plan.seq_len and plan.seq_len % plan.tp:
        valid = ", ".join(str(d) for d in divisors(plan.seq_len) if d <= 1024)
        return [f"--sp with --tp {plan.tp}: the sequence length {plan.seq_len} must divide by tp; valid --tp: {valid}"]
    return []


def apply_sp(sg: ShardedGraph, mesh, plan) -> ShardedGraph:
    if plan.sp:
        sg.hint("residual", "tp", Shard("s"))  # norms and dropout run on s/t tokens
    return sg


# --------------------------------------------------------------------------- zero


#: the zero strategy's option: reshard ZeRO-3's gathered weights after forward (FSDP's default)
ZERO_RESHARD = "zero-reshard"


def validate_zero(graph, plan) -> list[str]:
    if not plan.option(ZERO_RESHARD, True) and plan.zero < 3:
        return [f"--no-{ZERO_RESHARD}: keeps the weights ZeRO-3 gathers for the whole step; it needs --zero 3 "
                f"(ZeRO-{plan.zero} keeps whole weights anyway)"]
    return []


#: how ZeRO-3 gathers parameters: a layer's at once (an FSDP unit) or each tensor on its own
#: (DeepSpeed's ZeRO-3 fetches parameters one by one as modules ask for them)
ZERO_GATHER = "zero-gather"
ZERO_GATHERS = ("layer", "parameter")


def apply_zero(sg: ShardedGraph, mesh, plan) -> ShardedGraph:
    """ZeRO over the data-parallel ranks, which are dp x cp with context parallel (as
    Megatron's distributed optimizer shards over its data-parallel-with-CP group).  With
    ``--no-zero-reshard`` ZeRO-3's weights are gathered once per step, at their first use,
    and kept (FSDP without resharding after forward, as Llama 3 trains: arXiv 2407.21783
    section 3.3.2)."""
    stage = plan.zero
    if stage >= 3 and not plan.option(ZERO_RESHARD, True):
        sg.keep_gathered = True
    sg.gather_unit = plan.option(ZERO_GATHER, "layer")
    for axis in ("dp", "cp"):
        if not sg.active(axis) or axis not in sg.grad_target:
            continue
        if stage >= 1:
            sg.optimizer_sharded.add(axis)
            sg.grad_target[axis] = Shard(FLAT)  # reduce-scatter: each rank updates its shard
        if stage >= 2:
            sg.grad_storage_sharded.add(axis)
        if stage >= 3:
            for p in sg.graph.params:
                layout = dict(sg.storage_layout(p))
                layout[axis] = Shard(FLAT)  # stored sharded, gathered where used
                sg.param_storage[p] = layout
    return sg


# --------------------------------------------------------------------------- ep


def validate_ep(graph, plan) -> list[str]:
    experts = graph.dims.get("E")
    routed = experts is not None and any(op.fn == "moe_dispatch" for op in graph.ops)
    out = []
    if routed and not Mesh.from_plan(plan).expert_stages_match:
        out.append(f"--order {plan.order}: with pp before dp the expert layers' data-parallel degree (edp "
                   f"{plan.expert_dp}) must equal dp ({plan.dp}), or their pipeline stages would be other ranks "
                   f"(Megatron-Core); put pp last, or choose --ep/--etp so that edp = dp")
    if plan.ep == 1 and plan.etp is None:
        return out
    if not routed:
        what = f"--ep {plan.ep}" if plan.ep > 1 else f"--etp {plan.etp}"
        return [f"{what}: expert parallel needs a mixture-of-experts model; {graph.name} has no routed experts"]
    if experts % plan.ep:
        valid = [d for d in divisors(experts) if (plan.tp * plan.cp * plan.dp) % (d * plan.expert_tp) == 0]
        out.append(f"--ep {plan.ep}: the {experts} experts must split evenly over ep; valid --ep: "
                   f"{', '.join(map(str, valid))}")
    out += _need_divides("expert tensor parallel", "--etp", plan.expert_tp, graph.dims, ("fe",))
    if plan.tp > 1 and not plan.sp and plan.expert_tp != plan.tp:
        out.append(f"--etp {plan.expert_tp} without --sp: the TP ranks hold the same tokens, so the experts' "
                   f"tensor parallel group must be the TP group (--etp {plan.tp}); or add --sp")
    return out


def apply_ep(sg: ShardedGraph, mesh, plan) -> ShardedGraph:
    """Experts' weights split over ep (experts) and etp (FFN width), their gradients
    reduced over the expert-data-parallel group (ZeRO shards them there), tokens
    dispatched by ``plan.moe_dispatcher`` (the core's :mod:`stage_core.parallel.moe`)."""
    sg.moe_dispatcher = plan.moe_dispatcher
    experts = expert_tensors(sg.graph)
    weights = [p for p in sg.graph.params if p in experts]
    if not weights:
        return sg
    for p in weights:
        sg.param_compute.pop(p, None)
    sg.shard_params("ep", ("E",), where=lambda p: p in experts)
    sg.shard_params("etp", ("fe",), where=lambda p: p in experts)
    sg.grad_target["edp"] = Shard(FLAT) if plan.zero >= 1 else Replicate()
    if plan.zero >= 1:
        sg.optimizer_sharded.add("edp")
    if plan.zero >= 2:
        sg.grad_storage_sharded.add("edp")
    for p in weights:
        storage = dict(sg.compute_layout(p))
        if plan.zero >= 3:
            storage["edp"] = Shard(FLAT)
        sg.param_storage[p] = storage
    return sg


# --------------------------------------------------------------------------- recompute


def validate_recompute(graph, plan) -> list[str]:
    return []


def apply_recompute(sg: ShardedGraph, mesh, plan) -> ShardedGraph:
    sg.recompute = plan.recompute
    return sg


# --------------------------------------------------------------------------- pp


def _layers(graph) -> int:
    return len({op.layer for op in graph.ops if op.layer is not None})


def validate_pp(graph, plan) -> list[str]:
    if plan.pp == 1:
        return []
    chunks = plan.pp * plan.virtual_stages
    layers = _layers(graph)
    what = f"--pp {plan.pp}" + (f" x --virtual-stages {plan.virtual_stages}" if plan.virtual_stages > 1 else "")
    out = []
    given = plan.stage_layers
    if isinstance(given, tuple):
        if len(given) != chunks or sum(given) != layers:
            out.append(f"--stage-layers {','.join(map(str, given))}: {what} needs {chunks} layer counts, one per "
                       f"stage in order, summing to the model's {layers} layers (got {len(given)} summing to "
                       f"{sum(given)}); or --stage-layers auto")
    elif given is None and layers % chunks:
        valid = [str(d) for d in divisors(layers) if layers % (d * plan.virtual_stages) == 0]
        uneven = "; or give --stage-layers auto (or one count per stage)" if chunks <= layers else ""
        fix = (f"valid --pp: {', '.join(valid)}" if valid else
               f"--virtual-stages must divide {layers}; valid: {', '.join(map(str, divisors(layers)))}")
        out.append(f"{what}: the {layers} layers must split into {chunks} equal chunks; {fix}{uneven}")
    elif chunks > layers:
        out.append(f"{what}: {chunks} stages for {layers} layers; every stage needs at least one layer")
    if plan.virtual_stages > 1 and plan.schedule == "interleaved":  # (the host checks a schedule's chunks)
        if plan.micro_batches % plan.pp:
            out.append(f"--micro-batches {plan.micro_batches}: the interleaved schedule needs a multiple of "
                       f"--pp {plan.pp}")
    return out


#: Megatron-LM's scatter/gather between pipeline stages (Narayanan et al. 2021, section 4.1): each
#: tensor-parallel rank sends its 1/t of an activation replicated over tp, the receiver all-gathers
PP_SCATTER_GATHER = "pp-scatter-gather"


def apply_pp(sg: ShardedGraph, mesh, plan) -> ShardedGraph:
    sg.pipeline = (plan.pp, plan.virtual_stages)  # layers split into pp x virtual chunks, in order
    if plan.option(PP_SCATTER_GATHER):
        sg.pipeline_split = "tp"
    if plan.stage_layers == "auto":
        sg.stage_layers = balanced_split(layer_weights(sg.graph, plan), plan.pp * plan.virtual_stages)
    elif plan.stage_layers is not None:
        sg.stage_layers = tuple(plan.stage_layers)
    return sg
