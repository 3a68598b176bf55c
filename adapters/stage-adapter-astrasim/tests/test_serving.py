"""Serving metrics from simulated finish times (issue 25), by hand."""

import pytest

from stage_adapter_astrasim.parser import RankResult
from stage_adapter_astrasim.serving import format_serving, serving_results


def ranks(finish: dict[int, int | None]) -> dict[int, RankResult]:
    return {r: RankResult(r, t) for r, t in finish.items()}


def test_a_disaggregated_set_has_ttft_and_tpot_per_side():
    manifest = {"plan": {"task": "serve",
                         "prefill": {"dp": 2, "micro_batch_size": 2, "micro_batches": 1, "seq_len": 4096},
                         "decode": {"dp": 1, "micro_batch_size": 16, "micro_batches": 2, "decode_steps": 4}},
                "rank_classes": [{"ranks": [0, 1], "side": "prefill"}, {"ranks": [2, 3], "side": "prefill"},
                                 {"ranks": [4, 5, 6, 7], "side": "decode"}]}
    # prefill ranks finish at 6 and 7 ms; decode ranks at 9 ms (the last KV cache arrived at 7 ms)
    got = serving_results(manifest, ranks({0: 6_000_000, 1: 6_000_000, 2: 7_000_000, 3: 7_000_000,
                                           4: 9_000_000, 5: 9_000_000, 6: 8_500_000, 7: 9_000_000}))
    p, d = got["prefill"], got["decode"]
    assert p["requests"] == 4 and p["prompt_tokens"] == 4 * 4096
    assert p["ttft_s"] == pytest.approx(7e-3) and p["tokens_per_s"] == pytest.approx(4 * 4096 / 7e-3)
    # 2 ms of decode after the last KV cache, 4 steps: 0.5 ms per output token; 32 requests x 4 tokens
    assert d["requests"] == 32 and d["output_tokens"] == 128
    assert d["tpot_s"] == pytest.approx(0.5e-3) and d["tokens_per_s"] == pytest.approx(128 / 2e-3)
    text = format_serving(got).splitlines()
    assert text[0] == "prefill: time to first token 7.000 ms; 2,340,571 prompt tokens/s (4 requests, 16,384 prompt tokens)"
    assert text[1] == "decode: time per output token 0.500 ms; 64,000 output tokens/s (32 requests x 4 steps)"


def test_prefill_and_decode_sets_on_their_own():
    prefill = {"plan": {"task": "prefill", "dp": 1, "micro_batch_size": 4, "micro_batches": 2, "seq_len": 1024},
               "rank_classes": [{"ranks": [0, 1]}]}
    got = serving_results(prefill, ranks({0: 2_000_000, 1: 1_000_000}))
    assert set(got) == {"prefill", "note"} and got["prefill"]["ttft_s"] == pytest.approx(2e-3)
    decode = {"plan": {"task": "decode", "dp": 2, "micro_batch_size": 8, "micro_batches": 1, "decode_steps": 2},
              "rank_classes": [{"ranks": [0, 1, 2, 3]}]}
    got = serving_results(decode, ranks({0: 3_000_000, 1: 3_000_000, 2: 3_000_000, 3: 3_000_000}))
    assert got["decode"]["tpot_s"] == pytest.approx(1.5e-3) and got["decode"]["tokens_per_s"] == pytest.approx(32 / 3e-3)


def test_training_has_none_and_an_unfinished_side_has_no_times():
    assert serving_results({"plan": {"task": "train"}, "rank_classes": [{"ranks": [0]}]}, ranks({0: 5})) is None
    decode = {"plan": {"task": "decode", "dp": 1, "micro_batch_size": 1, "micro_batches": 1, "decode_steps": 1},
              "rank_classes": [{"ranks": [0, 1]}]}
    got = serving_results(decode, ranks({0: 3_000_000, 1: None}))  # (rank 1 never finished)
    assert got["decode"]["tpot_s"] is None and got["decode"]["tokens_per_s"] is None
    assert "time per output token -; - output tokens/s" in format_serving(got)
