"""Serving metrics of a disaggregated set in the real simulator (issue 25): time to first
token, time per output token and tokens/s per side, from the simulated finish times."""

import io
import json
import os

import pytest

from stage_core.cli import main

ASTRA_SIM = os.environ.get("ASTRA_SIM_BIN")
pytestmark = pytest.mark.skipif(not ASTRA_SIM, reason="ASTRA_SIM_BIN is not set: no ASTRA-sim analytical binary")


def test_a_served_set_says_ttft_tpot_and_tokens_per_second(host, capsys, tmp_path):
    from stage_adapter_astrasim.command import run_astrasim

    argv = ["generate", "--model", "llama-tiny", "--task", "serve", "--prefill-ranks", "2", "--decode-ranks", "2",
            "--prefill-plan", "micro-batch-size=2", "--decode-plan", "micro-batch-size=8", "--decode-steps", "3",
            "--seq-len", "128", "--gpu", "h100", "-o", str(tmp_path / "set"), "--quiet"]
    assert main(argv, host=host) == 0
    capsys.readouterr()
    out, text = io.StringIO(), io.StringIO()
    assert run_astrasim(tmp_path / "set", astra_sim=ASTRA_SIM, as_json=True, out=out, err=io.StringIO()) == 0
    results = json.loads(out.getvalue())
    finish = {r["rank"]: r["finish_time_ns"] for r in results["ranks"]}
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    prefill = max(finish[r] for rc in manifest["rank_classes"] if rc["side"] == "prefill" for r in rc["ranks"])
    decode = max(finish[r] for rc in manifest["rank_classes"] if rc["side"] == "decode" for r in rc["ranks"])
    served = results["serving"]
    # prefill: dp 2 x 2 requests of 128 tokens; decode: dp 2 x 8 requests, 3 steps
    assert served["prefill"]["requests"] == 4 and served["prefill"]["prompt_tokens"] == 512
    assert served["prefill"]["ttft_s"] == pytest.approx(prefill * 1e-9, rel=1e-12)
    assert served["prefill"]["tokens_per_s"] == pytest.approx(512 / (prefill * 1e-9))
    assert decode > prefill  # (the decode ranks wait for the KV caches)
    assert served["decode"]["requests"] == 16 and served["decode"]["output_tokens"] == 48
    assert served["decode"]["tpot_s"] == pytest.approx((decode - prefill) * 1e-9 / 3)
    assert served["decode"]["tokens_per_s"] == pytest.approx(48 / ((decode - prefill) * 1e-9))
    assert run_astrasim(tmp_path / "set", astra_sim=ASTRA_SIM, out=text, err=io.StringIO()) == 0
    lines = text.getvalue().splitlines()
    assert any(line.startswith(f"prefill: time to first token {prefill / 1e6:,.3f} ms;") for line in lines)
    assert any(line.startswith("decode: time per output token ") for line in lines)
