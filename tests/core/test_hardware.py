"""Hardware records and compute models through the hooks; hardware files; kernels as GEMMs."""

import json

import pytest

from stage_core import hardware, hookimpl
from stage_core.errors import PluginError, UsageError
from stage_core.kernel import Gemm, kernel
from stage_core.records import ComputeModelSpec, GpuSpec, HardwareSpec, LinkSpec
from stage_core.testing import fresh_host

GPU = GpuSpec(name="g", description="a test GPU", matmul_tflops={"bf16": 100.0}, vector_tflops=10.0,
              hbm_gbps=1000.0, sm_count=10, compute_model="flat", parameters={"eff": 0.5},
              sources={"eff": "made up"})
HW = HardwareSpec(name="box", description="8 test GPUs", gpu=GPU, gpus_per_node=8,
                  scale_up=LinkSpec("fast", 100.0, 0.5, 1000.0), scale_out=LinkSpec("slow", 10.0, 1.0, 2000.0))


def flat_time(k, gpu):
    return k.flops / (gpu.peak_flops(k.dtype) * gpu.parameters["eff"])


class Plugin:
    @staticmethod
    @hookimpl
    def stage_hardware():
        return [HW]

    @staticmethod
    @hookimpl
    def stage_compute_models():
        return [ComputeModelSpec(name="flat", time=flat_time, parameters={"eff": "fraction of peak"})]


def test_a_plugin_registers_hardware_and_a_compute_model():
    host = fresh_host((Plugin(), "mine"))
    (hw,) = host.hardware()
    assert hw.name == "box" and hw.plugin == "mine"
    model = host.compute_model(hw.gpu.compute_model)
    k = kernel("einsum", "", "forward", "mk,kn->mn", {"m": 10, "k": 10, "n": 10}, "bf16",
               flops=2000, matmul_flops=2000, nbytes=600)
    assert model.time(k, hw.gpu) == pytest.approx(2000 / 50e12)
    info = {i.name: i.provides for i in host.info()}
    assert info["mine"]["hardware"] == ("box",) and info["mine"]["compute_models"] == ("flat",)


def test_two_plugins_with_one_preset_name_clash():
    host = fresh_host((Plugin(), "one"), (type("Other", (Plugin,), {})(), "two"))
    with pytest.raises(PluginError, match=r"hardware preset name 'box' is registered by two plugins"):
        host.hardware()


def test_unknown_names_list_what_is_known():
    host = fresh_host((Plugin(), "mine"))
    with pytest.raises(UsageError, match=r"--gpu tpu: unknown hardware preset; known: box"):
        hardware.resolve(host, "tpu")
    with pytest.raises(UsageError, match=r"compute model 'fancy'.*known: flat"):
        host.compute_model("fancy", "g")


def test_hardware_files_round_trip(tmp_path):
    path = tmp_path / "box.json"
    hardware.save(HW, path)
    assert hardware.load(path) == HW
    assert hardware.resolve(fresh_host(), str(path)) == HW
    assert path.read_text().startswith('{\n  "stage_version": ')  # the mark that lets a rerun replace it
    hardware.save(HW, path)  # (so it may: STAGE wrote it)


@pytest.mark.parametrize("change,message", [
    (lambda d: d["gpu"].pop("hbm_gbps"), "missing key 'hbm_gbps'"),
    (lambda d: d["gpu"].update(sm_count=-1), "gpu.sm_count: -1 is not a positive finite number"),
    (lambda d: d["scale_up"].update(speed=1), "unknown key 'speed'"),
    (lambda d: d["gpu"]["parameters"].update(eff="fast"), "gpu.parameters.eff 'fast' is not a finite number"),
    # what stage calibrate used to write, and --gpu FILE then crashed on (issue 26)
    (lambda d: d["gpu"]["parameters"].update(launch_us=float("nan")), "launch_us nan is not a finite number"),
    (lambda d: d["gpu"]["parameters"].update(launch_us=float("inf")), "launch_us inf is not a finite number"),
    (lambda d: d["gpu"]["parameters"].update(gemm_k_half=-3.5), "gemm_k_half -3.5 is not a finite number of 0"),
    (lambda d: d["gpu"]["parameters"].update(gemm_efficiency=12816.0),
     r"gemm_efficiency 12816.0 is not a share of the datasheet's figure \(above 0, at most 1\)"),
    (lambda d: d["gpu"].update(parameters=[1, 2]), "gpu.parameters must be an object"),
    (lambda d: d["gpu"].update(vector_tflops=float("inf")), "gpu.vector_tflops: inf is not a positive finite"),
    (lambda d: d["scale_out"].update(efficiency=1.5), r"scale_out.efficiency 1.5 is above 1"),
])
def test_a_bad_hardware_file_is_one_line(tmp_path, change, message):
    data = hardware.to_dict(HW)
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=message):
        hardware.load(path)


def test_einsums_read_as_gemms():
    def gemm(spec, **sizes):
        return kernel("einsum", "", "forward", spec, sizes, "bf16", flops=1, matmul_flops=1, nbytes=1).gemm()

    # a linear layer: tokens x hidden times hidden x ffn
    assert gemm("bsh,hf->bsf", b=2, s=8, h=16, f=64) == Gemm(1, 16, 64, 16)
    # its weight gradient: the tokens are the K loop
    assert gemm("bsh,bsf->hf", b=2, s=8, h=16, f=64) == Gemm(1, 16, 64, 16)
    # attention scores: batch b*g*r, s x d times d x k
    assert gemm("bsgrd,bkgd->bgrsk", b=2, s=8, g=4, r=1, d=16, k=8) == Gemm(8, 8, 8, 16)
    assert Gemm(8, 8, 8, 16).flops == 2 * 8 * 8 * 8 * 16
    elementwise = kernel("elementwise", "gelu", "forward", "bsf->bsf", {"b": 1, "s": 1, "f": 1}, "bf16",
                         flops=9, matmul_flops=0, nbytes=4)
    assert elementwise.gemm() is None


def test_transfer_times_are_the_ring_formulas():
    # all-reduce of 1 MB on 8 GPUs of one node: 2*7/8 MB at 50 GB/s, 14 steps of two 1 us links
    assert hardware.transfer_seconds(HW, "all_reduce", 10**6, range(8)) == pytest.approx(
        2 * 7 / 8 * 1e6 / 50e9 + 14 * 2 * 1e-6)
    # the same group spread over two nodes is bound by the slow tier: 10 GB/s, 2 us links
    assert hardware.transfer_seconds(HW, "all_reduce", 10**6, [0, 8, 16, 24]) == pytest.approx(
        2 * 3 / 4 * 1e6 / 10e9 + 6 * 2 * 2e-6)
    # all-gather's comm_size is the shard: (n-1) shards arrive
    assert hardware.transfer_seconds(HW, "all_gather", 10**6, range(4)) == pytest.approx(
        3 * 1e6 / 50e9 + 3 * 2 * 1e-6)
    assert hardware.transfer_seconds(HW, "send", 10**6, [0, 8]) == pytest.approx(1e6 / 10e9 + 2 * 2e-6)
    # and back: the bytes that take a given time
    for kind, ranks in (("all_reduce", range(8)), ("all_gather", range(4)), ("send", [0, 8])):
        seconds = hardware.transfer_seconds(HW, kind, 10**6, ranks)
        assert hardware.transfer_bytes(HW, kind, seconds, ranks) == pytest.approx(10**6, abs=1)


def test_the_simulators_roofline_in_whole_nanoseconds_and_the_first_kernel():
    from stage_core.hardware import first_kernel, roofline_ns
    from stage_core.trace import NodeType, ProgramNode

    # 520 B at 3,350 GB/s: 0.155 ns, truncated to 0; 1 GFLOP at 989.4 TFLOPS: 1,010.7 ns
    assert roofline_ns(1, 520, 989.4, 3350.0) == 0
    assert roofline_ns(10**9, 10**6, 989.4, 3350.0) == 1010
    assert roofline_ns(10**6, 10**7, 989.4, 3350.0) == 2985  # memory bound: 1e7 B / 3.35e12 B/s
    nodes = [ProgramNode(3, "late root", NodeType.COMP), ProgramNode(0, "recv", NodeType.COMM_RECV),
             ProgramNode(1, "after recv", NodeType.COMP, data_deps=(0,)), ProgramNode(2, "root", NodeType.COMP)]
    assert first_kernel(nodes).name == "root"
    assert first_kernel(nodes[1:2]) is None
