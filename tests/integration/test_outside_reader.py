"""mlcommons/chakra's own reader (``decodeMessage``) reads generated sets node by node as
STAGE's reader does (every set the simulator tests run goes through it too, see
``replay_and_simulate``).  Skipped, with the reason, where the package is absent."""

from __future__ import annotations

from pathlib import Path

import pytest
from outside_reader import NO_CHAKRA, chakra_reader, compare_with_chakra

from stage_core import hardware
from stage_core.flow import plan_job, write_trace_set
from stage_core.parallel import Plan

DATA = Path(__file__).parent / "data" / "prechain"  # see test_differential
PRECHAIN = sorted(p.name for p in DATA.iterdir() if p.is_dir())
CHAKRA = chakra_reader()
pytestmark = pytest.mark.skipif(CHAKRA is None, reason=NO_CHAKRA)

SETS = [  # every node type, every attribute, both kinds of peers, timed nodes
    ("gpt-tiny", Plan(tp=2, sp=True, dp=2, zero=1), {}, None),
    ("gpt2", Plan(pp=2, tp=2, micro_batches=4, schedule="interleaved", virtual_stages=2, seq_len=64),
     {"layers": "4"}, None),
    ("llama-tiny", Plan(cp=2, tp=2, sp=True, pp=2, cp_comm="p2p", micro_batches=2), {}, "h100"),
    ("moe-tiny", Plan(dp=2, tp=2, sp=True, zero=3, seq_len=64), {}, "a100"),
]


@pytest.mark.parametrize("model,plan,overrides,gpu", SETS, ids=[s[0] for s in SETS])
def test_chakra_reads_a_generated_set_as_stage_does(host, tmp_path, model, plan, overrides, gpu):
    timing = hardware.resolve(host, gpu) if gpu else None
    result = plan_job(host, model, overrides, plan, timing)
    out = write_trace_set(host, result, tmp_path / "set")
    nodes = sum(len(p.nodes) * len(p.ranks) for p in result.job.programs)
    assert compare_with_chakra(host, out, CHAKRA) == nodes


@pytest.mark.parametrize("name", PRECHAIN)
def test_chakra_reads_the_kept_sets_as_stage_does(host, name):
    assert compare_with_chakra(host, DATA / name, CHAKRA) > 0
