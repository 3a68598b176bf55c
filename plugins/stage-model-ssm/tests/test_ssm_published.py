"""Published config.json files of Mamba-1 models (Falcon Mamba, Jamba) read by their keys,
the parameter count of each checkpoint, and the selective scan's costs.

Sources of ``configs/``: tiiuae/falcon-mamba-7b's and ai21labs/Jamba-v0.1's config.json
(their Hugging Face repositories; Jamba's shape keys as they are reproduced in public code
that reads them).  Counts are computed from the graph the family builds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stage_core.api import differentiate, evaluate_sum, hf_import_of, inference_graph, layer_kinds, param_counts, step_values, total
from stage_core.testing import fresh_host

from stage_model_ssm import PRESETS, build, plugin
from stage_model_ssm.scan import SCAN_BWD_PER_CHANNEL, SCAN_BWD_PER_STATE, SCAN_PER_CHANNEL, SCAN_PER_STATE

CONFIGS = Path(__file__).parent / "configs"
#: Jamba-v0.1's parameters, as a reproduction of the checkpoint counts them exactly
JAMBA_V01 = 51_570_323_328
#: tiiuae/falcon-mamba-7b's model card: 7.27B parameters
FALCON_MAMBA_7B = 7.27e9


def imported(name: str):
    return fresh_host((plugin, "ssm")).config_from_hf(json.loads((CONFIGS / f"{name}.json").read_text()))


def test_jamba_imports_with_the_checkpoints_count():
    c = imported("Jamba-v0.1")
    assert c.family == "jamba" and c.layers == 32
    assert c.replace(name="jamba-v0.1") == PRESETS["jamba-v0.1"]
    g = build(c)
    assert param_counts(g)[0] == JAMBA_V01
    assert layer_kinds(g) == {"mamba + mlp": 12, "mamba + moe": 16, "attention + mlp": 4}
    assert abs(param_counts(g)[1] - 12e9) < 0.02 * 12e9  # "12B active"


def test_falcon_mamba_imports_with_the_model_cards_count():
    c = imported("falcon-mamba-7b")
    assert c.family == "mamba" and c.replace(name="falcon-mamba-7b", seq_len=8192) == PRESETS["falcon-mamba-7b"]
    n = param_counts(build(c))[0]
    assert abs(n - FALCON_MAMBA_7B) <= 0.0007 * FALCON_MAMBA_7B  # the card's rounding
    # by hand: in_proj h·2C, conv C·K + C, x_proj C·(R + 2N), dt_proj R·C + C, A_log C·N, D C,
    # out_proj C·h and the layer's norm h; two tables (untied) and the final norm
    h, C, N, K, R, L, V = 4096, 8192, 16, 4, 256, 64, 65024
    layer = h * 2 * C + C * K + C + C * (R + 2 * N) + R * C + C + C * N + C + C * h + h
    assert n == L * layer + 2 * V * h + h
    assert "expand" in hf_import_of(c)["ignored_keys"]  # intermediate_size says d_inner


def scan_op(graph):
    return next(op for op in graph.ops if op.fn == "selective_scan")


def test_selective_scan_costs_by_hand():
    c = PRESETS["mamba1-tiny"]
    g = build(c)
    op = scan_op(g)
    b, s, C, N = 2, 64, c.ssm_channels, c.ssm_state
    values = step_values(g, b=b, s=s)
    assert total(g, "flops", values, [op]) == b * s * (C * N * SCAN_PER_STATE + C * SCAN_PER_CHANNEL)
    assert total(g, "matmul_flops", values, [op]) == 0
    item = 2
    assert total(g, "bytes", values, [op]) == (4 * item * b * s * C + 2 * item * b * s * N + 4 * C * N + 4 * C
                                               + 2 * item * b * C * N)
    # backward: one kernel writing every input's gradient
    tg = differentiate(g)
    bwd = [o for o in tg.ops if o.fn and o.fn.startswith("selective_scan") and o.phase == "backward"]
    assert len(bwd) == c.layers
    assert total(tg, "flops", values, bwd[:1]) == b * s * (C * N * SCAN_BWD_PER_STATE + C * SCAN_BWD_PER_CHANNEL)


def test_decode_keeps_the_scan_state_and_conv_state_per_request():
    c = PRESETS["mamba1-tiny"]
    ig = inference_graph(build(c), "decode")
    states = [t for t in ig.caches if t.seq_dim is None]
    per_layer = c.ssm_channels * c.ssm_state + (c.conv_kernel - 1) * c.ssm_channels
    assert evaluate_sum([t.tensor.numel for t in states], step_values(ig, b=1, s=1)) == c.layers * per_layer


@pytest.mark.parametrize("layers", [1, 4])
def test_set_num_hidden_layers_keeps_jambas_periods(layers):
    host = fresh_host((plugin, "ssm"))
    c = host.config_from_hf(json.loads((CONFIGS / "Jamba-v0.1.json").read_text()))
    cut = c.with_overrides({"num_hidden_layers": str(layers * 2)})
    assert cut.pattern == PRESETS["jamba-v0.1"].pattern[:4 * layers]
