"""Compute nodes timed on a GPU: whole microseconds whose running sum stays exact."""

from stage_core import hookimpl
from stage_core.flow import plan_job
from stage_core.kernel import Gemm, kernel
from stage_core.parallel.plan import Plan
from stage_core.records import ComputeModelSpec, GpuSpec, HardwareSpec, LinkSpec
from stage_core.testing import fresh_host, toy_plugin
from stage_core.timing import node_kernel, time_program
from stage_core.trace import NodeType, ProgramNode, RankProgram


def comp(nid, seconds):
    k = kernel("elementwise", "t", "forward", "n->n", {"n": nid}, "bf16", flops=0, matmul_flops=0,
               nbytes=int(seconds * 1e12))
    return ProgramNode(nid, f"k{nid}", NodeType.COMP, num_ops=1, tensor_size=1, kernel=k)


def by_bytes(k):  # a kernel takes bytes / 1e12 seconds: bytes picks the time
    return k.bytes / 1e12


def test_short_kernels_keep_their_total():
    # 1000 kernels of 0.3 us: rounded one by one they would be 0 us each; carried, 300 us
    program = RankProgram((0,), tuple(comp(i, 0.3e-6) for i in range(1000)))
    timed, total = time_program(program, by_bytes)
    durations = [n.duration_micros for n in timed.nodes]
    assert total == sum(durations) == 300
    assert set(durations) == {0, 1}
    running = 0
    for i, d in enumerate(durations, 1):  # every prefix (a layer, a micro-batch) stays within half a us
        running += d
        assert abs(running - 0.3 * i) <= 0.5 + 1e-9


def test_long_kernels_round_to_the_nearest_microsecond():
    program = RankProgram((0,), (comp(0, 10.4e-6), comp(1, 10.4e-6), comp(2, 10.4e-6)))
    timed, total = time_program(program, by_bytes)
    assert [n.duration_micros for n in timed.nodes] == [10, 11, 10]  # 10.4, 20.8, 31.2 -> 10, 21, 31
    assert total == 31


def test_communication_nodes_are_not_timed():
    send = ProgramNode(1, "send", NodeType.COMM_SEND, comm_size=8, peer="pp+1")
    timed, total = time_program(RankProgram((0,), (comp(0, 5e-6), send)), by_bytes)
    assert [n.duration_micros for n in timed.nodes] == [5, 0] and total == 5


def test_a_node_without_a_kernel_is_timed_by_its_counts():
    node = ProgramNode(0, "x", NodeType.COMP, num_ops=4096, tensor_size=64, flops_kind="matmul")
    k = node_kernel(node)
    assert (k.flops, k.matmul_flops, k.bytes) == (4096, 4096, 64)


# a GPU of round numbers whose compute model charges FLOPs at 1 TFLOPS
GPU = GpuSpec(name="unit", description="1 TFLOPS", matmul_tflops={"bf16": 1.0}, vector_tflops=1.0,
              hbm_gbps=1.0, sm_count=1, compute_model="flops")
UNIT = HardwareSpec(name="unit", description="one unit GPU per node", gpu=GPU, gpus_per_node=1,
                    scale_up=LinkSpec("a", 1.0, 1.0, 1.0), scale_out=LinkSpec("b", 1.0, 1.0, 1.0))


class UnitHardware:
    @staticmethod
    @hookimpl
    def stage_hardware():
        return [UNIT]

    @staticmethod
    @hookimpl
    def stage_compute_models():
        return [ComputeModelSpec(name="flops", time=lambda k, gpu: k.flops / gpu.peak_flops(k.dtype))]


def test_plan_job_times_every_compute_node_and_records_the_hardware():
    host = fresh_host((toy_plugin, "toy"), (UnitHardware(), "unit"))
    result = plan_job(host, "toy", {}, Plan(), gpu=UNIT)
    (program,) = result.job.programs
    (rc,) = result.manifest["rank_classes"]
    comps = [n for n in program.nodes if n.type == NodeType.COMP]
    assert sum(n.duration_micros for n in comps) == rc["compute_time_us"]
    # 1 TFLOPS: the step's FLOPs in microseconds (rounded once, at the end)
    assert rc["compute_time_us"] == round(rc["flops"]["total"] / 1e6)
    assert result.manifest["hardware"]["name"] == "unit" and result.manifest["compute_model"] == "flops"
    # the first MLP matmul of the toy model (h 64, f 256, seq 32, micro-batch 1): tokens x h times h x f
    by_name = {n.name: n.kernel for n in comps}
    assert by_name["mb0.fwd.layers.0.mlp.fc1"].gemm() == Gemm(1, 32, 256, 64)
    # its weight gradient: h x f, the 32 tokens are the K loop
    assert by_name["mb0.bwd.layers.0.mlp.fc1.bwd.wgrad"].gemm() == Gemm(1, 64, 256, 32)


def test_without_a_gpu_nothing_is_timed():
    host = fresh_host((toy_plugin, "toy"))
    result = plan_job(host, "toy", {}, Plan())
    assert all(n.duration_micros == 0 for n in result.job.programs[0].nodes)
    assert "hardware" not in result.manifest and "compute_time_us" not in result.manifest["rank_classes"][0]


def test_every_compute_node_carries_a_kernel_with_its_counts():
    host = fresh_host((toy_plugin, "toy"))
    result = plan_job(host, "toy", {}, Plan())
    for n in result.job.programs[0].nodes:
        if n.type == NodeType.COMP:
            assert n.kernel is not None, n.name
            assert n.num_ops == max(n.kernel.flops, 1) and n.tensor_size == max(n.kernel.bytes, 1)


def test_kernels_are_shared_between_copies_of_an_op():
    host = fresh_host((toy_plugin, "toy"))
    result = plan_job(host, "toy", {}, Plan(micro_batches=2))
    names = {}
    for n in result.job.programs[0].nodes:
        if n.type == NodeType.COMP and n.name.startswith("mb"):
            names.setdefault(n.name.split(".", 1)[1], []).append(n.kernel)
    shared = [ks for ks in names.values() if len(ks) == 2]
    assert shared and all(ks[0] is ks[1] for ks in shared)
