"""The replay estimator through the stage_estimators hook gives what `stage estimate` prints."""

import io
import json
from contextlib import redirect_stdout

from search_hardware import H100, Hardware

from stage_core.api import Plan, main, plan_job
from stage_core.testing import fresh_host, reference_strategies, toy_plugin
from stage_search import plugin


def test_the_hook_gives_stage_estimates_step_and_each_nodes_times():
    host = fresh_host((toy_plugin, "toy"), (plugin, "search"), (Hardware(), "hw"), (reference_strategies, "ref"))
    flags = ["--model", "toy", "--pp", "2", "--dp", "2", "--micro-batches", "4", "--gpu", "h100"]
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["estimate", *flags, "--json"], host=host) == 0
    printed = json.loads(out.getvalue())
    spec = host.estimator("replay")
    assert spec.plugin == "search"
    result = plan_job(host, "toy", {}, Plan(pp=2, dp=2, micro_batches=4), H100)
    got = spec.estimate(result, H100)
    assert got["step_time_s"] == printed["step_time_s"] and got["mfu"] == printed["mfu"]
    # one start and finish per node of each stage's program; the slowest stage's last node ends the step
    assert [len(t) for t in got["node_finish_s"]] == [len(p.nodes) for p in result.job.programs]
    assert max(float(t.max()) for t in got["node_finish_s"]) == got["step_time_s"]
    for rc, finish in zip(printed["rank_classes"], got["node_finish_s"]):
        assert float(finish.max()) == rc["finish_s"]
    assert all((f >= s).all() for s, f in zip(got["node_start_s"], got["node_finish_s"]))
