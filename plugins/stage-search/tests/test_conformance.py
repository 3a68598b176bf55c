"""The local executor against STAGE's conformance kit."""

from stage_core.testing import assert_executor, fresh_host

from stage_search import plugin


def test_the_local_executor_runs_every_item_once():
    assert assert_executor(fresh_host((plugin, "search")), "local", {"workers": 2}) == 7


def test_the_replay_estimator_is_the_sum_of_the_kernels_on_one_gpu():
    """On one GPU every kernel runs after the one before (one compute slot): the replay's step of
    a one-rank plan is the sum of its compute nodes' durations, exactly (a 0 us node taking 1 ns)."""
    from search_hardware import H100, Hardware

    from stage_core.api import Plan, plan_job
    from stage_core.testing import assert_estimator, toy_plugin

    host = fresh_host((toy_plugin, "toy"), (plugin, "search"), (Hardware(), "hw"))
    step = assert_estimator(host, "replay", "h100")
    [program] = plan_job(host, "toy", {}, Plan(), H100).job.programs
    assert step == sum(n.duration_micros * 1000 or 1 for n in program.nodes) * 1e-9
