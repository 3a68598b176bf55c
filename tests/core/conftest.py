from stage_core import hookimpl
from stage_core.parallel import R
from stage_core.records import StrategySpec
from stage_core.testing import stage_host  # noqa: F401  (pytest fixture)


def _dp(sg, mesh, plan):
    sg.shard_inputs("dp", "b")
    sg.grad_target["dp"] = R
    return sg


class DP:
    """A data-parallel strategy of the tests' own (the batch split over dp, gradients
    all-reduced), for tests that need one without stage-parallel."""

    @hookimpl
    def stage_strategies(self):
        return [StrategySpec("dp", "dp", lambda g, p: [], _dp)]


def pytest_terminal_summary(terminalreporter, config):
    """The fuzz tests' counts per category (test_fuzz_*.py), after the run."""
    for line in config.__dict__.pop("fuzz_counts", []):  # (once, if both conftests load)
        terminalreporter.write_line(line)
