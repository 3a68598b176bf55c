"""How many layers each pipeline chunk gets: given, or balanced by compute.

``--stage-layers auto`` balances the training work of the chunks (pp x virtual
stages, in chunk order: all stages of virtual stage 0, then of virtual stage 1...).
A transformer layer weighs its forward and backward FLOPs, so dense and MoE layers
count what they cost.  The embedding and the LM head with the loss each count as
one more layer of average weight, on the first and the last chunk, as Megatron's
``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``
count them: Llama 3 405B (126 equal layers) at pp16 gets 7, 8 x 14, 7.

The split minimises the heaviest chunk, and among the splits that do, the sum of
squared chunk weights (so the slack spreads out instead of piling up at one end).
Every chunk gets at least one layer.
"""

from __future__ import annotations

from stage_core.api import balanced_split, flops_by_layer


def layer_weights(graph, plan) -> list[int]:
    """The FLOPs of each transformer layer of the task's ``graph`` in one step, in order:
    forward + backward in training, forward over the cache in prefill and decode (whose
    kernels also read ``ctx``, the tokens attended to: decode's --context-len, prefill's
    prompt)."""
    values = dict(graph.dims)
    # b scales every layer alike; a decode step's single token needs b = E for whole rows per expert
    b = int(values.get("E", 1)) if plan.seq_len == 1 else 1
    values.update(b=b, s=plan.seq_len, ctx=plan.context_len or plan.seq_len)
    per_layer = flops_by_layer(graph, values)
    return [per_layer[layer] for layer in sorted(per_layer)]
