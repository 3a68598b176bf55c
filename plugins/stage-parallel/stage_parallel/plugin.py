"""Registers the standard strategies with STAGE."""

from stage_core import hookimpl
from stage_core.records import OptionSpec, StrategySpec

from . import context
from . import strategies as s
from .plans import builtin_plans


@hookimpl
def stage_strategies():
    return [
        StrategySpec("dp", "dp", s.validate_dp, s.apply_dp, order=10,
                     description="data parallel: batch split, gradients all-reduced once per step in buckets"),
        StrategySpec("tp", "tp", s.validate_tp, s.apply_tp, order=20,
                     description="Megatron tensor parallel: column/row parallel attention and MLP, vocab-parallel "
                                 "embedding, head and cross-entropy; a CNN's convolutions over their channels",
                     options=(OptionSpec("tp-convs", str, "channels",
                                         "convolutions under --tp: split their channels, or their images (data: Das "
                                         "et al. 2016's hybrid, the fully connected layers model parallel)",
                                         choices=s.TP_CONVS),)),
        StrategySpec("cp", "cp", context.validate_cp, context.apply_cp, order=15,
                     description="context parallel: sequences split in 2 x cp chunks (balanced causal work), "
                                 "attention by ring p2p, K/V all-gather or all-to-all (--cp-comm); gradients "
                                 "reduced over dp x cp"),
        StrategySpec("sp", "tp", s.validate_sp, s.apply_sp, order=30,
                     description="Megatron sequence parallel: norms and dropout on s/t, all-gather/reduce-scatter"),
        StrategySpec("zero", "dp", s.validate_zero, s.apply_zero, order=40,
                     description="ZeRO stages 1-3 (3 = FSDP): optimizer, gradients, parameters sharded over dp",
                     options=(OptionSpec(s.ZERO_RESHARD, bool, True,
                                         "ZeRO-3: gather each layer's weights again for backward and every "
                                         "micro-batch (FSDP's reshard after forward); --no-zero-reshard gathers "
                                         "them once per step and keeps them (Llama 3's FSDP)"),
                              OptionSpec(s.ZERO_GATHER, str, "layer",
                                         "how ZeRO-3 gathers parameters before a layer runs: layer (one all-gather "
                                         "of its parameters, an FSDP unit) or parameter (one per tensor, as "
                                         "DeepSpeed's ZeRO-3 fetches them)", choices=s.ZERO_GATHERS))),
        StrategySpec("ep", "ep", s.validate_ep, s.apply_ep, order=45,
                     description="expert parallel (Megatron-Core): experts split over ep (carved out of dp x cp) "
                                 "and etp, tokens dispatched by all-to-all or all-gather, expert gradients "
                                 "reduced over the expert-data-parallel group"),
        StrategySpec("pp", "pp", s.validate_pp, s.apply_pp, order=60,
                     description="pipeline parallel: layers split into stages (x virtual stages), evenly, as given "
                                 "or balanced by compute (--stage-layers), activations and their gradients sent "
                                 "between them, micro-batches ordered by the schedule",
                     options=(OptionSpec(s.PP_SCATTER_GATHER, bool, False,
                                         "Megatron's scatter/gather between pipeline stages: each tensor-parallel "
                                         "rank sends its 1/tp of an activation (or its gradient) that all of them "
                                         "hold, and the receiving stage all-gathers it over tp (Narayanan et al. "
                                         "2021, section 4.1; with --sp the slices are sent already)"),)),
        StrategySpec("recompute", None, s.validate_recompute, s.apply_recompute, order=50,
                     description="activation recompute: selective (attention core) or full (whole layer)"),
    ]


@hookimpl
def stage_plans():
    return builtin_plans()
