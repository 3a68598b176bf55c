"""Background communication cut into the compute windows of timed sets: every rank still finishes."""

import pytest

from stage_core import hardware
from stage_core.flow import plan_job, write_trace_set
from stage_core.parallel import Plan

# tp, pp, dp and ZeRO together: gradient buckets and ZeRO-3 gathers share the slot with
# TP collectives and pipeline sends; "cut": some background collective is split in pieces
TIMED = [
    ("gpt2-large", Plan(pp=2, tp=2, dp=2, micro_batches=4, seq_len=1024), False),
    ("gpt2-large", Plan(pp=2, dp=4, zero=3, micro_batches=2, schedule="gpipe", seq_len=1024), True),
    ("gpt2-large", Plan(pp=2, tp=2, sp=True, dp=2, zero=1, micro_batches=4, schedule="interleaved",
                        virtual_stages=2, recompute="full", seq_len=1024), True),
    ("llama3-8b", Plan(pp=2, tp=2, dp=2, micro_batches=2, seq_len=4096), True),
]


@pytest.mark.parametrize("model,plan,cut", TIMED, ids=lambda x: x if isinstance(x, str) else None)
def test_timed_sets_with_background_pieces_finish(host, tmp_path, simulate, model, plan, cut):
    result = plan_job(host, model, {"layers": "8" if model.startswith("gpt2") else "4"}, plan,
                      hardware.resolve(host, "h100"))
    pieces = [n.name for p in result.job.programs for n in p.nodes if ":part" in n.name]
    assert bool(pieces) == cut
    out = tmp_path / "set"
    write_trace_set(host, result, out)
    status, results = simulate(out, system=None)
    assert results["summary"]["deadlocked_ranks"] == []
    assert results["summary"]["finished_ranks"] == plan.world_size and status == 0
