"""DeepSeek-V3's MLA at inference: the cache is the latent and the rope key (576 elements
per token per layer, REFERENCE §4), and decode runs MLA absorbed (DeepSeek-V2 §2.1.2).

Oracles: DeepSeek-V3's config (h 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512,
qk_nope 128, qk_rope 64, v_head 128), its attention's matmuls counted by hand.
"""

from __future__ import annotations

from stage_core.api import CONTEXT, evaluate_sum, inference_graph

from stage_model_moe import PRESETS, build

H, A, RQ, RKV, DN, DR, DV = 7168, 128, 1536, 512, 128, 64, 128


def attention_matmuls(graph, layer, values):
    ops = [op for op in graph.kernels() if op.layer == layer and op.name.startswith(f"layers.{layer}.attn.")]
    return evaluate_sum([op.matmul_flops for op in ops], values)


def test_deepseek_v3_caches_576_elements_per_token_per_layer():
    c = PRESETS["deepseek-v3"].replace(layers=4)
    for task in ("prefill", "decode"):
        g = inference_graph(build(c.for_task(task)), task)
        values = {**g.dims, "b": 1, "s": 1, CONTEXT: 1}
        per_layer = {}
        for decl in g.caches:
            layer = decl.name.split(".")[1]
            per_layer[layer] = per_layer.get(layer, 0) + evaluate_sum([decl.tensor.numel], values)
        assert per_layer == {str(i): RKV + DR for i in range(4)} == {str(i): 576 for i in range(4)}


def test_deepseek_v3_decode_attends_over_the_latent():
    ctx = 4096
    c = PRESETS["deepseek-v3"].replace(layers=4)
    assert not c.mla_absorbed and c.for_task("decode").mla_absorbed and not c.for_task("prefill").mla_absorbed
    g = inference_graph(build(c.for_task("decode")), "decode")
    values = {**g.dims, "b": 1, "s": 1, CONTEXT: ctx}
    hand = 2 * (H * RQ + RQ * A * (DN + DR)  # the query's two projections
                + H * (RKV + DR)  # the latent and the rope key
                + A * DN * RKV  # q_nope through W_uk
                + A * ctx * (RKV + DR) + A * ctx * RKV  # Q·Kᵀ over latent+rope, P·V over the latent
                + A * RKV * DV  # the context through W_uv
                + A * DV * H)  # the output projection
    assert attention_matmuls(g, 0, values) == hand
    # the flash kernel reads each cached token's 576 elements once (the value is the key's head)
    (flash,) = [op for op in g.ops if op.layer == 0 and op.fn == "flash_attention"]
    reads = evaluate_sum([flash.bytes], values)
    q_and_out = 2 * A * (RKV + DR) + 2 * A * RKV + 4 * A
    assert reads == 2 * ctx * (RKV + DR) + q_and_out


def test_training_and_prefill_keep_the_decompressed_form():
    c = PRESETS["deepseek-v3"].replace(layers=4)
    assert c.for_task("train") is c and c.for_task("prefill") is c
    names = {op.name for op in build(c).ops}
    assert "layers.0.attn.kv_b" in names and "layers.0.attn.q_absorb" not in names
