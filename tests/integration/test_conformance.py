"""Every installed plugin against the conformance kit, together: the model families under
the real strategies (stage-parallel's whole matrix), the backends with tensor parallel, the
simulator on a written set, the schedules finishing in ASTRA-sim."""

from __future__ import annotations

import os

import pytest

from conftest import ASTRA_SIM, NO_SIMULATOR
from stage_core.plugins import PluginHost
from stage_core.testing import (assert_backend_round_trip, assert_flops_conserved, assert_schedule_like_1f1b,
                                assert_simulator, assert_tp_shards_or_warns)

HOST = PluginHost()
#: the ops each family computes whole on every tensor-parallel rank, as Megatron-Core does: the MoE
#: router, and MLA's query and key/value down-projections (the low-rank latents); Zamba2's LoRA
#: down-projections (their rank-128 latents) and the hybrid layers' [h, h] linear
REPLICATED = {"moe-tiny": ("router_logits",), "hybrid-tiny": ("router_logits",),
              "moe-mla-tiny": ("router_logits", "attn.q_a", "attn.kv_a"),
              "zamba2-tiny": ("adapter.down", "shared.linear")}
TINY = ("gpt-tiny", "llama-tiny", "moe-tiny", "moe-mla-tiny", "gemma-tiny", "mamba2-tiny", "hybrid-tiny",
        "zamba2-tiny")
#: mamba2-tiny has one SSM group, which tensor parallel cannot split
OVERRIDES = {"mamba2-tiny": {"ssm_groups": "2"}}


@pytest.mark.parametrize("model", TINY)
def test_tiny_models_conserve_flops_under_the_standard_strategies(model):
    # the strategy matrix restricted to plans the model takes (some need 4 layers, heads that divide...)
    assert assert_flops_conserved(HOST, model, overrides=OVERRIDES.get(model), replicated=REPLICATED.get(model, ())) \
        >= 40


@pytest.mark.parametrize("model", TINY)
def test_tensor_parallel_shards_every_family(model):
    assert assert_tp_shards_or_warns(HOST, model, OVERRIDES.get(model)) == "sharded"


@pytest.mark.parametrize("backend", ["chakra", "chakra-json"])
def test_backends_round_trip_with_tensor_parallel(backend, tmp_path):
    assert assert_backend_round_trip(HOST, backend, tmp_path, model="gpt-tiny") == 2 + 2 + 4


@pytest.mark.parametrize("name,variable", [("astrasim", "ASTRA_SIM_BIN"), ("astrasim-aware", "ASTRA_SIM_AWARE_BIN"),
                                           ("astrasim-htsim", "ASTRA_SIM_HTSIM_BIN")])
def test_the_simulator_runs_a_set(tmp_path, name, variable):
    """The kit's simulator check on each ASTRA-sim backend, with the chakra backend writing the set (the
    adapter's own tests cannot: a distribution's tests run with only the core and itself installed)."""
    if not os.environ.get(variable):
        pytest.skip(f"{variable} is not set: no ASTRA-sim {name} binary on this machine")
    assert assert_simulator(HOST, name, tmp_path, model="gpt-tiny") > 0


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_builtin_schedules_finish_in_the_simulator(schedule, tmp_path):
    if not ASTRA_SIM:
        pytest.skip(NO_SIMULATOR)
    rows = assert_schedule_like_1f1b(HOST, schedule, tmp_path, model="gpt-tiny", overrides={"layers": "8"})
    assert all(r["astrasim"] > 0 for r in rows)
