import pytest

import stage_parallel.plugin as parallel
from stage_core.api import plan_job, write_trace_set
from stage_core.testing import fresh_host, jsonl_plugin, read_jsonl, toy_plugin


@pytest.fixture
def host():
    return fresh_host((toy_plugin, "toy"), (jsonl_plugin, "jsonl"), (parallel, "parallel"))


@pytest.fixture
def traces(host, tmp_path):
    """Generate, write with the plain jsonl backend (validated), and read the set back."""
    counter = iter(range(1000))

    def run(plan, model="toy", overrides=None):
        result = plan_job(host, model, overrides or {}, plan)
        out = write_trace_set(host, result, tmp_path / f"set{next(counter)}", "jsonl")
        ts = read_jsonl(out)
        return result, ts, dict(ts.iter_ranks())

    return run
