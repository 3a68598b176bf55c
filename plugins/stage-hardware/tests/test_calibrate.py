"""`stage calibrate` on a small Kineto-format profile whose kernels a known GPU produced."""

from __future__ import annotations

import dataclasses
import json
import re
import zlib

import pytest

from stage_core.api import hardware, main
from stage_core.testing import fresh_host
from stage_hardware import kineto, plugin
from stage_hardware.compute import calibrated_time
from stage_hardware.presets import CALIBRATED_PRESETS

A100 = next(p for p in CALIBRATED_PRESETS if p.name == "a100-calibrated")  # the calibrated model's fit
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
    assert main(["calibrate", str(tmp_path / "step.json"), "--gpu", "a100-calibrated", "-o", str(out)], host=host) == 0
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
    main(["calibrate", str(tmp_path / "step.json"), "--gpu", "a100-calibrated", "-o", str(out)], host=host)
    gpu = hardware.load(out).gpu
    for k, seconds in kineto.read(tmp_path / "step.json").samples:
        assert calibrated_time(k, gpu) == pytest.approx(seconds, rel=0.02)


def test_a_file_that_is_not_a_profile_is_one_line(host, tmp_path, capsys):
    (tmp_path / "bad.json").write_text("[1, 2")
    assert main(["calibrate", str(tmp_path / "bad.json"), "--gpu", "a100-calibrated", "-o", str(tmp_path / "o.json")],
                host=host) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a PyTorch profiler trace" in err
    assert not (tmp_path / "o.json").exists()


# --------------------------------------------------------------------------- issue 26


def calibrate(host, capsys, profile, out, *more):
    status = main(["calibrate", str(profile), "--gpu", "a100-calibrated", "-o", str(out), *more], host=host)
    return status, capsys.readouterr().err


def test_the_profile_it_reads_is_never_its_output(host, tmp_path, capsys):
    # `stage calibrate -o X X` overwrote the profile, often a user's only copy of a measurement
    synthetic_profile(tmp_path / "step.json")
    before = (tmp_path / "step.json").read_bytes()
    for more in ((), ("--force",)):
        status, err = calibrate(host, capsys, tmp_path / "step.json", tmp_path / "step.json", *more)
        assert status == 2 and err.count("\n") == 1 and "which this command reads" in err, err
    assert (tmp_path / "step.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.json"]


def test_a_users_file_needs_force_a_device_never(host, tmp_path, capsys):
    synthetic_profile(tmp_path / "step.json")
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "notes"}')
    status, err = calibrate(host, capsys, tmp_path / "step.json", mine)
    assert status == 2 and "exists and STAGE did not write it; give another name, or --force" in err
    assert mine.read_text() == '{"my": "notes"}'
    assert calibrate(host, capsys, tmp_path / "step.json", mine, "--force")[0] == 0
    assert calibrate(host, capsys, tmp_path / "step.json", mine)[0] == 0  # now a file STAGE wrote
    status, err = calibrate(host, capsys, tmp_path / "step.json", "/dev/null", "--force")
    assert status == 2 and "is a character device" in err


def _scaled_profile(path, factor, kernel_names):
    """The synthetic profile with the durations of the named kernels divided by ``factor``."""
    synthetic_profile(path)
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"] in kernel_names:
            e["dur"] /= factor
    path.write_text(json.dumps(doc))


GEMM_KERNELS = {"sm80_xmma_gemm_bf16bf16", "ampere_bf16_s16816gemm"}


def test_parameters_beyond_the_datasheet_are_refused_naming_the_kernels(host, tmp_path, capsys):
    # GEMMs that took half the time the GPU (gemm_efficiency 0.72) can: 1.44 of the peak
    _scaled_profile(tmp_path / "fast.json", 2, GEMM_KERNELS)
    status, err = calibrate(host, capsys, tmp_path / "fast.json", tmp_path / "o.json")
    assert status == 2 and err.count("\n") == 1, err
    # (0.72 x 2 = 1.44; the GEMMs the fitted model bounds by compute: at most the 17 there are)
    found = re.search(r"the (\d+) gemm kernels give gemm_efficiency = 1\.4\d*, which is not a share of the "
                      r"datasheet's figure \(above 0, at most 1\) \(beyond the a100's 312 TFLOP/s bf16 peak\)", err)
    assert found and 1 <= int(found[1]) <= 17, err
    assert "Nothing was written" in err and not (tmp_path / "o.json").exists()
    # 20,000 times faster: the fit puts the GEMMs on the memory roof, thousands of times the HBM
    # bandwidth, and the profile's 8 elementwise kernels (4 sizes of gelu and layer norm) with them
    _scaled_profile(tmp_path / "faster.json", 20_000, GEMM_KERNELS)
    status, err = calibrate(host, capsys, tmp_path / "faster.json", tmp_path / "o.json")
    found = re.search(r"the 8 memory-bound kernels give hbm_efficiency = ([0-9.e+]+), which", err)
    assert status == 2 and found and float(found[1]) > 1000, err
    assert "beyond the a100's 2039 GB/s HBM bandwidth" in err and not (tmp_path / "o.json").exists()


def test_a_nan_from_the_fit_is_refused_naming_the_kernels(host, tmp_path, capsys):
    # memory-bound kernels that take less time the more bytes they move: the fit's slope is
    # negative, so 1 / slope (hbm_efficiency) was written as NaN
    t = Trace()
    for n, micros in ((1 << 16, 900.0), (1 << 20, 600.0), (1 << 24, 300.0), (1 << 26, 10.0)):
        t.op("aten::gelu", [[n]], [BF16], [("vectorized_elementwise_kernel", micros)])
    t.write(tmp_path / "odd.json")
    status, err = calibrate(host, capsys, tmp_path / "odd.json", tmp_path / "o.json")
    assert status == 2 and err.count("\n") == 1, err
    assert "the 4 memory-bound kernels give hbm_efficiency = nan, which is not a finite number" in err
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("event,needle", [
    ({"ph": "X", "cat": "kernel", "name": "k", "dur": "abc", "args": {}}, "dur 'abc' is not a duration"),
    ({"ph": "X", "cat": "kernel", "name": "k", "dur": float("nan"), "args": {}}, "dur nan is not a duration"),
    ({"ph": "X", "cat": "kernel", "name": "k", "dur": -5, "args": {}}, "dur -5 is not a duration"),
])
def test_a_malformed_kernel_event_is_one_line(host, tmp_path, capsys, event, needle):
    (tmp_path / "p.json").write_text(json.dumps({"traceEvents": [event]}))
    status, err = calibrate(host, capsys, tmp_path / "p.json", tmp_path / "o.json")
    assert status == 2 and err.count("\n") == 1 and needle in err, err


def test_malformed_operator_events_are_left_out(tmp_path):
    # ids that are lists, args that are not objects, shapes of strings: tracebacks before
    t = Trace()
    t.op("aten::mm", [[512, 1024], [1024, 4096]], [BF16, BF16], [("gemm", 100.0)])
    t.events += [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "args": {"External id": [1], "Input Dims": [[2, 2]]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "args": [1, 2]},
        {"ph": "X", "cat": "kernel", "name": "k2", "dur": 7.0, "args": "nope"},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "args": {"External id": 77, "Input Dims": [["a"], [2]],
                                                                  "Input type": [BF16, {"x": 1}]}},
        {"ph": "X", "cat": "kernel", "name": "k3", "dur": 2.0, "args": {"External id": 77}},
    ]
    t.write(tmp_path / "p.json")
    found = kineto.read(tmp_path / "p.json")
    assert kineto.classes(found.samples) == {"gemm": 1}
    assert found.unmapped == {"k2": pytest.approx(7e-6), "aten::add": pytest.approx(2e-6)}
