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


def _llama3(name: str, gpus: str, degrees: dict, seq_len: int, batch_per_dp_group: int, extra: str = "",
            **more) -> PlanSpec:
    settings = {"model": "llama3-405b", **degrees, "sp": True, "zero": 3, "stage-layers": "auto",
                "seq-len": seq_len, "micro-batch-size": 1,
                "global-batch": batch_per_dp_group * degrees["dp"], "order": LLAMA3_ORDER, "gpu": "h100", **more}
    return PlanSpec(
        name=name, settings=settings, source=LLAMA3,
        description=(f"Llama 3 405B on {gpus} H100s: {batch_per_dp_group} sequences of {seq_len:,} tokens per DP "
                     f"group (16M tokens per step), DP as FSDP, TP with sequence parallel, 126 layers as 7, 8x14, 7 "
                     f"over 16 stages (the paper's first and last stage one layer short), 1F1B, micro-batch 1"
                     f"{extra}"))


def builtin_plans() -> list[PlanSpec]:
    return [
        _llama3("llama3-405b-8k-gpus", "8,192", {"tp": 8, "pp": 16, "dp": 64}, 8192, 32),
        _llama3("llama3-405b-16k-gpus", "16,384", {"tp": 8, "pp": 16, "dp": 128}, 8192, 16),
        _llama3("llama3-405b-16k-gpus-128k", "16,384", {"tp": 8, "cp": 16, "pp": 16, "dp": 8}, 131072, 16,
                "; CP all-gathers K and V (the paper's choice)", **{"cp-comm": "all-gather"}),
        PlanSpec(
            name="gpt3-175b-megatron",
            settings={"model": "gpt3-175b", "tp": 8, "pp": 8, "dp": 16, "schedule": "interleaved",
                      "virtual-stages": 2, "recompute": "full", "seq-len": 2048, "micro-batch-size": 1,
                      "global-batch": 1536, "gpu": "a100"},
            source="Narayanan et al. 2021 (arXiv 2104.04473); Megatron-LM's GPT-3 175B example",
            description="GPT-3 175B as Megatron-LM trains it: tp8 pp8 with the interleaved 1F1B schedule "
                        "(2 virtual stages of 6 layers per GPU), full activation recompute, global batch 1,536 "
                        "sequences of 2,048 tokens, micro-batch 1, on 1,024 GPUs (dp16)"),
    ]
