from stage_core import hookimpl
from stage_core.parallel import R
from stage_core.records import ComputeModelSpec, GpuSpec, HardwareSpec, LinkSpec, StrategySpec
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


def tiny_gpu(gib: float):
    """A plugin registering one hardware preset, ``tiny``, with ``gib`` GiB per GPU and a
    compute model that times every kernel at 1 us (the preset is its ``hw``)."""
    gpu = GpuSpec(name="tiny", description="a small GPU", matmul_tflops={"bf16": 1.0}, vector_tflops=1.0,
                  hbm_gbps=1.0, sm_count=1, compute_model="flat", memory_gib=gib)
    hw = HardwareSpec(name="tiny", description="", gpu=gpu, gpus_per_node=8,
                      scale_up=LinkSpec("a", 1.0, 1.0, 1.0), scale_out=LinkSpec("b", 1.0, 1.0, 1.0))

    class Hardware:
        @hookimpl
        def stage_hardware(self):
            return [hw]

        @hookimpl
        def stage_compute_models(self):
            return [ComputeModelSpec(name="flat", time=lambda k, g: 1e-6)]

    plugin = Hardware()
    plugin.hw = hw
    return plugin
