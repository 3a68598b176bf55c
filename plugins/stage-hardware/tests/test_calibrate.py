"""`stage calibrate` on a small Kineto-format profile whose kernels a known GPU produced."""

from __future__ import annotations

import dataclasses
import json
import zlib

import pytest

from stage_core.api import hardware, main
from stage_core.testing import fresh_host
from stage_hardware import kineto, plugin
from stage_hardware.compute import calibrated_time
from stage_hardware.presets import PRESETS

A100 = next(p for p in PRESETS if p.name == "a100")
# the GPU that "ran" the profile: the A100 datasheet with parameters unlike the preset's
TRUE = {"gemm_efficiency": 0.72, "gemm_k_half": 140.0, "flash_fwd_efficiency": 0.58,
        "flash_bwd_efficiency": 0.41, "hbm_efficiency": 0.83, "launch_us": 4.5}
TRUE_GPU = dataclasses.replace(A100.gpu, parameters=TRUE)


class Trace:
    """Builds Kineto trace events: an operator (cpu_op) and the kernels it launched."""

    def __init__(self):
        self.events, self.ext, self.ts = [], 0, 0.0

    def op(self, name, dims, types, kernels, via_runtime=False):
        self.ext += 1
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": self.ts, "dur": 5,
                            "args": {"External id": self.ext, "Input Dims": dims, "Input type": types}})
        for kname, dur in kernels:
            corr = 1000 + len(self.events)
            if via_runtime:  # older traces: the kernel names only its launch's correlation id
                self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                                    "tid": 1, "ts": self.ts, "dur": 2,
                                    "args": {"External id": self.ext, "correlation": corr}})
                args = {"correlation": corr, "device": 0, "stream": 7}
            else:
                args = {"External id": self.ext, "correlation": corr, "device": 0, "stream": 7}
            self.events.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": self.ts,
                                "dur": dur, "args": args})
            self.ts += dur + 1

    def write(self, path):
        path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": self.events}))


def micros(name, dims, types):
    """What TRUE_GPU takes for an operator, in microseconds, with a little measurement noise."""
    k = kineto._operator_kernel(name, {"Input Dims": dims, "Input type": types})
    noise = 1 + 0.004 * ((zlib.crc32(f"{name}{dims}".encode()) % 5) - 2)  # within +-0.8%
    return calibrated_time(k, TRUE_GPU) * 1e6 * noise


BF16 = "c10::BFloat16"


def synthetic_profile(path, via_runtime=False):
    t = Trace()
    for m in (512, 2048, 8192):  # linear layers: tokens x hidden times hidden x ffn
        for k, n in ((1024, 4096), (4096, 1024), (256, 2048), (8192, 8192), (64, 4096)):
            dims, types = [[m, k], [k, n]], [BF16, BF16]
            t.op("aten::mm", dims, types, [("sm80_xmma_gemm_bf16bf16", micros("aten::mm", dims, types))],
                 via_runtime)
    for b in (16, 64):  # attention scores, batched
        dims, types = [[b, 2048, 128], [b, 128, 2048]], [BF16, BF16]
        t.op("aten::bmm", dims, types, [("ampere_bf16_s16816gemm", micros("aten::bmm", dims, types))])
    for s in (1024, 4096):  # FlashAttention forward and backward, [b, s, heads, d]
        q = [2, s, 16, 128]
        fwd = [q, q, q]
        t.op("aten::_flash_attention_forward", fwd, [BF16] * 3,
             [("flash_fwd_kernel", micros("aten::_flash_attention_forward", fwd, [BF16] * 3))])
        bwd = [q, q, q, q, q, [2, 16, s]]
        btypes = [BF16] * 5 + ["float"]
        t.op("aten::_flash_attention_backward", bwd, btypes,
             [("flash_bwd_kernel", micros("aten::_flash_attention_backward", bwd, btypes))])
    for n in (4096, 65536, 1 << 20, 1 << 24):  # elementwise and normalisation kernels
        for name in ("aten::gelu", "aten::native_layer_norm"):
            dims, types = [[n]], [BF16]
            t.op(name, dims, types, [("vectorized_elementwise_kernel", micros(name, dims, types))])
    # what calibration must leave out: communication, and a kernel without an operator
    t.op("c10d::allreduce_", [[1 << 20]], [BF16], [("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 900.0)])
    t.events.append({"ph": "X", "cat": "kernel", "name": "orphan_kernel", "pid": 0, "tid": 7, "ts": t.ts,
                     "dur": 3.0, "args": {"External id": 99999}})
    t.write(path)


@pytest.fixture
def host():
    return fresh_host((plugin, "hardware"))


def test_calibrate_recovers_known_parameters_within_two_percent(host, tmp_path, capsys):
    synthetic_profile(tmp_path / "step.json")
    out = tmp_path / "mine.json"
    assert main(["calibrate", str(tmp_path / "step.json"), "--gpu", "a100", "-o", str(out)], host=host) == 0
    got = hardware.load(out)
    for name, value in TRUE.items():
        assert got.gpu.parameters[name] == pytest.approx(value, rel=0.02), name
        assert "stage calibrate" in got.gpu.sources[name]
    assert got.gpu.hbm_gbps == A100.gpu.hbm_gbps and got.scale_out == A100.scale_out  # the datasheet stays
    printed = capsys.readouterr().out
    assert "not mapped: orphan_kernel" in printed and "nccl" not in printed.lower()


def test_kernels_found_through_the_runtime_correlation(tmp_path):
    synthetic_profile(tmp_path / "old.json", via_runtime=True)
    found = kineto.read(tmp_path / "old.json")
    assert kineto.classes(found.samples)["gemm"] == 17  # 15 mm and 2 bmm operators
    assert found.unmapped == {"orphan_kernel": pytest.approx(3e-6)}


def test_the_written_file_times_kernels_as_the_profile_did(host, tmp_path):
    synthetic_profile(tmp_path / "step.json")
    out = tmp_path / "mine.json"
    main(["calibrate", str(tmp_path / "step.json"), "--gpu", "a100", "-o", str(out)], host=host)
    gpu = hardware.load(out).gpu
    for k, seconds in kineto.read(tmp_path / "step.json").samples:
        assert calibrated_time(k, gpu) == pytest.approx(seconds, rel=0.02)


def test_a_file_that_is_not_a_profile_is_one_line(host, tmp_path, capsys):
    (tmp_path / "bad.json").write_text("[1, 2")
    assert main(["calibrate", str(tmp_path / "bad.json"), "--gpu", "a100", "-o", str(tmp_path / "o.json")],
                host=host) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a PyTorch profiler trace" in err
    assert not (tmp_path / "o.json").exists()
