"""Published training plans, as named presets of flags (``stage plans``, ``--plan NAME``).

A plan names the GPU it ran on (``gpu``): its report times the compute and shows each
rank's memory beside the GPU's.

Each plan is what its source publishes; where the source is silent the choice is the
common one for that stack and is said in the description.
"""

from __future__ import annotations

from stage_core.records import PlanSpec

LLAMA3 = "Llama 3 (arXiv 2407.21783) Table 4"
#: Llama 3's group order [TP, CP, PP, DP], fastest first (ep has no ranks of its own here)
LLAMA3_ORDER = "tp-cp-ep-pp-dp"


#: Llama 3 405B's 126 layers over 16 stages x 8 one-layer chunks, one layer fewer on the first and last
#: stage: the first chunk is the embedding alone, the last the output projection and loss alone
LLAMA3_CHUNKS = 8
LLAMA3_STAGE_LAYERS = "0,1x126,0"


def _llama3(name: str, gpus: str, degrees: dict, seq_len: int, batch_per_dp_group: int, extra: str = "",
            **more) -> PlanSpec:
    settings = {"model": "llama3-405b", **degrees, "sp": True, "zero": 3, "zero-reshard": False,
                "schedule": "llama3", "virtual-stages": LLAMA3_CHUNKS, "stage-layers": LLAMA3_STAGE_LAYERS,
                "seq-len": seq_len, "micro-batch-size": 1,
                "global-batch": batch_per_dp_group * degrees["dp"], "order": LLAMA3_ORDER, "gpu": "h100", **more}
    return PlanSpec(
        name=name, settings=settings, source=LLAMA3 + "; section 3.3.2 for the schedule and FSDP",
        description=(f"Llama 3 405B on {gpus} H100s: {batch_per_dp_group} sequences of {seq_len:,} tokens per DP "
                     f"group (16M tokens per step), micro-batch 1; TP with sequence parallel; DP as FSDP that "
                     f"shards gradients and optimizer state and does not reshard weights after forward "
                     f"(gathered once per step: ZeRO-3 with --no-zero-reshard); PP with the paper's interleaved "
                     f"schedule (--schedule llama3, N = pp contiguous micro-batches a round) over 16 stages x "
                     f"{LLAMA3_CHUNKS} one-layer chunks, one layer fewer on the first and last stage: the first "
                     f"chunk is the embedding alone, the last the output projection and loss alone"
                     f"{extra}. Needs stage-schedule-llama3 (the schedule)"))


def builtin_plans() -> list[PlanSpec]:
    return [
        _llama3("llama3-405b-8k-gpus", "8,192", {"tp": 8, "pp": 16, "dp": 64}, 8192, 32),
        _llama3("llama3-405b-16k-gpus", "16,384", {"tp": 8, "pp": 16, "dp": 128}, 8192, 16),
        _llama3("llama3-405b-16k-gpus-128k", "16,384", {"tp": 8, "cp": 16, "pp": 16, "dp": 8}, 131072, 16,
                "; CP all-gathers K and V (the paper's choice)", **{"cp-comm": "all-gather"}),
        PlanSpec(
            name="gpt3-175b-megatron",
            settings={"model": "gpt3-175b", "set": ["attention=classic"], "tp": 8, "pp": 8, "dp": 16,
                      "schedule": "interleaved", "virtual-stages": 2, "recompute": "full", "seq-len": 2048,
                      "micro-batch-size": 1, "global-batch": 1536, "gpu": "a100"},
            source="Narayanan et al. 2021 (arXiv 2104.04473); Megatron-LM's GPT-3 175B example",
            description="GPT-3 175B as Megatron-LM trains it: tp8 pp8 with the interleaved 1F1B schedule "
                        "(2 virtual stages of 6 layers per GPU), full activation recompute, global batch 1,536 "
                        "sequences of 2,048 tokens, micro-batch 1, on 1,024 GPUs (dp16), classic attention (the "
                        "2021 Megatron-LM had no FlashAttention)"),
        PlanSpec(
            name="deepseek-v3",
            settings={"model": "deepseek-v3", "pp": 16, "dp": 128, "ep": 64, "zero": 1, "stage-layers": "auto",
                      "seq-len": 4096, "micro-batch-size": 1, "global-batch": 15360, "gpu": "h100"},
            source="DeepSeek-V3 technical report (arXiv 2412.19437) §3.2 and §4.2",
            description="DeepSeek-V3 (671B) on 2,048 GPUs: pp16 (its 61 layers split by compute: 3,3,4x13,3), "
                        "ep64 carved out of dp128 (expert data parallel 2), ZeRO-1, no tp; 4,096-token sequences "
                        "and the final batch of 15,360 (micro-batch 1 assumed). STAGE runs 1F1B, not DualPipe, "
                        "keeps bf16 activations (the report stores some in FP8 and recomputes norms and MLA "
                        "up-projections), and times H800s as the h100 preset (same compute and 80 GB; NVLink "
                        "400 GB/s there): the first stage fits, the MoE stages' activations do not"),
        PlanSpec(
            name="mixtral-8x7b-megatron",
            settings={"model": "mixtral-8x7b", "tp": 1, "pp": 4, "dp": 16, "ep": 8, "schedule": "interleaved",
                      "virtual-stages": 8, "zero": 1, "moe-dispatcher": "alltoall", "seq-len": 4096,
                      "micro-batch-size": 1, "global-batch": 256, "gpu": "h100"},
            source="Megatron-Core MoE README, reference parallel mapping of MCore v0.8 (Mixtral 8x7B, dropless)",
            description="Mixtral 8x7B as Megatron-Core trains it on 64 H100s: tp1 pp4 with 8 virtual stages of "
                        "one layer, ep8 carved out of dp16, all-to-all dispatcher, dropless routing, distributed "
                        "optimizer (ZeRO-1), 4,096-token sequences, micro-batch 1, global batch 256"),
    ]
