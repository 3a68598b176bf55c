"""The same sets under ASTRA-sim's packet-level htsim backend: verdicts and compute agree.

A representative part of the strategy matrix (dp, tp+sp, the pp schedules, cp, ep,
ZeRO-3, prefill and decode), timed on h100 and within one node (8 ranks at most: across
nodes htsim's frontend aborts, see the adapter's README), runs under the analytical
backend and under htsim.  Each set must finish on every rank in both, as `stage
validate`'s replay says; the compute each rank does (ASTRA-sim's ``GPU time``) is the
same number in both, since only the network differs.  The step under htsim against the
analytical one is listed at the end of the run (``benchmarks/bench_backends.py`` says
what the difference means).  A set broken on purpose leaves the ranks the replay names
unfinished under htsim too, which reports it at its 4 s limit.
"""

import io
import json
import os

import pytest

from stage_core.parallel import Plan

HTSIM = os.environ.get("ASTRA_SIM_HTSIM_BIN")
ANALYTICAL = os.environ.get("ASTRA_SIM_BIN")

pytestmark = pytest.mark.skipif(
    not (HTSIM and ANALYTICAL),
    reason="ASTRA_SIM_HTSIM_BIN and ASTRA_SIM_BIN are not both set: no htsim and analytical ASTRA-sim binaries "
           "(CI sets them from ../shared/astra-sim)")

TINY_LLAMA = {"layers": 2}
MATRIX = [
    ("dp", "gpt-tiny", Plan(dp=4), {}),
    ("tp+sp", "llama-tiny", Plan(tp=2, sp=True, dp=2), TINY_LLAMA),
    ("pp 1f1b", "gpt-tiny", Plan(pp=2, micro_batches=4, schedule="1f1b"), {}),
    ("pp gpipe", "gpt-tiny", Plan(pp=2, dp=2, micro_batches=4, schedule="gpipe"), {}),
    ("pp interleaved", "gpt-tiny", Plan(pp=2, tp=2, micro_batches=4, schedule="interleaved", virtual_stages=2),
     {"layers": 4}),
    ("cp", "llama-tiny", Plan(cp=2, tp=2, sp=True, cp_comm="p2p", micro_batches=2), TINY_LLAMA),
    ("ep", "moe-tiny", Plan(dp=4, ep=4, seq_len=64), {}),
    ("zero-3", "gpt-tiny", Plan(dp=4, zero=3), {}),
    ("prefill", "llama-tiny", Plan(task="prefill", tp=2, pp=2, micro_batches=2, seq_len=256), TINY_LLAMA),
    ("decode", "llama-tiny", Plan(task="decode", tp=2, dp=2, micro_batch_size=4, context_len=128), TINY_LLAMA),
]


def _run(out, backend, binary, validate=True):
    from stage_adapter_astrasim.command import run_astrasim

    text, err = io.StringIO(), io.StringIO()
    status = run_astrasim(out, astra_sim=binary, backend=backend, as_json=True, out=text, err=err, validate=validate)
    return status, json.loads(text.getvalue()), err.getvalue()


@pytest.mark.parametrize("label,model,plan,overrides", MATRIX, ids=[m[0] for m in MATRIX])
def test_the_matrix_subset_finishes_under_htsim_as_under_the_analytical_network(
        host, tmp_path, request, label, model, plan, overrides):
    from stage_core import hardware
    from stage_core.flow import plan_job, read_trace_set, write_trace_set
    from stage_core.validate import examine

    result = plan_job(host, model, {k: str(v) for k, v in overrides.items()}, plan, hardware.resolve(host, "h100"))
    out = write_trace_set(host, result, tmp_path / "set")
    verdict = examine(read_trace_set(host, out)).verdict
    assert verdict.finishes
    status, analytical, _ = _run(out, "analytical", ANALYTICAL)
    assert status == 0
    status, packets, err = _run(out, "htsim", HTSIM)
    summary = packets["summary"]
    assert (status, summary["outcome"], summary["unfinished_ranks"]) == (0, "finished", []), err
    assert summary["finished_ranks"] == plan.world_size
    assert packets["backend"] == "htsim" and packets["topology"] == "preset h100"
    gpu = {r["rank"]: r["gpu_time_ns"] for r in analytical["ranks"]}
    assert {r["rank"]: r["gpu_time_ns"] for r in packets["ranks"]} == gpu
    step_a, step_h = analytical["summary"]["max_finish_time_ns"], summary["max_finish_time_ns"]
    assert step_h >= max(gpu.values())  # a rank's kernels run one at a time
    request.config.__dict__.setdefault("htsim_rows", []).append(
        f"htsim {label:<15} {model} {plan.world_size} ranks: {summary['finished_ranks']}/{plan.world_size} finished, "
        f"step {step_h / 1e6:.3f} ms, analytical {step_a / 1e6:.3f} ms ({step_h / step_a:.2f}x)")


def test_a_set_broken_on_purpose_stops_the_ranks_the_replay_names(host, tmp_path):
    """Rank 1 of a dp2 set loses its last gradient all-reduce: the replay names the ranks
    that never finish; the analytical backend reports them as a deadlock, htsim leaves
    the same ranks unfinished when it stops at 4 s of simulated time, and says it cannot
    tell that from a long step (the set was not validated)."""
    from stage_core.flow import read_trace_set
    from stage_core.trace import NodeType
    from stage_core.validate import examine
    from test_differential import dropped, written

    out = written(host, tmp_path, "gpt-tiny", Plan(dp=2), {}, dropped(NodeType.COMM_COLL, -1), 1)
    stuck = list(examine(read_trace_set(host, out)).verdict.unfinished)
    assert stuck == [0]
    status, analytical, _ = _run(out, "analytical", ANALYTICAL, validate=False)
    assert (status, analytical["summary"]["outcome"], analytical["summary"]["deadlocked_ranks"]) == (1, "deadlock", stuck)
    status, packets, err = _run(out, "htsim", HTSIM, validate=False)
    summary = packets["summary"]
    assert (status, summary["outcome"], summary["unfinished_ranks"], summary["deadlocked_ranks"]) == (
        1, "time_limit", stuck, [])
    assert "error: htsim stopped at its limit of 4 s of simulated time with ranks 0 unfinished (1 of 2)" in err
    assert "either the step takes longer, or these ranks wait forever" in err
