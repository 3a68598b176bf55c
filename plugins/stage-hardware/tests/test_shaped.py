"""The shaped compute model against hand-computed cases, its fit against known parameters, and the
measured-table reader."""

import dataclasses

import pytest

from stage_core.api import UsageError, main
from stage_core.records import GpuSpec
from stage_core.testing import fresh_host
from stage_hardware import plugin, shaped, tables
from stage_hardware.shaped import flash_work, gemm_base, shaped_time

# round numbers: 100 TFLOPS over 10 SMs (10 TFLOPS each), 1 TB/s
PARAMS = {"gemm_efficiency": 0.8, "gemm_k_half": 64.0, "gemm_tile_cost": 0.25, "flash_fwd_efficiency": 0.6,
          "flash_bwd_efficiency": 0.4, "hbm_efficiency": 0.9, "norm_efficiency": 0.5, "launch_us": 2.0}
GPU = GpuSpec(name="t", description="t", matmul_tflops={"bf16": 100.0}, vector_tflops=10.0, hbm_gbps=1000.0,
              sm_count=10, compute_model="shaped", parameters=PARAMS)


def test_a_gemm_of_full_waves_takes_its_best_tile():
    # 2560 x 1280 output: 256x128 tiles -> 10 x 10 = 100 tiles, 10 full waves on 10 SMs; each tile
    # 2 x 256 x 128 x (4096 + 64) FLOPs x (1 + 0.25 x 64 (1/256 + 1/128)) at 10 TFLOPS per SM
    per_tile = 2 * 256 * 128 * (4096 + 64) * (1 + 0.25 * 64 * (1 / 256 + 1 / 128)) / 10e12
    assert gemm_base(1, 2560, 1280, 4096, 10, 100e12, 64, 0.25) == pytest.approx(10 * per_tile)
    # one row more: the 256x128 grid needs 11 waves; 128x128 tiles (21 x 10 = 210 tiles, 21 waves of a
    # tile half as large, 1.125x the loss per multiply-add) are faster: the model takes the fastest
    small = 2 * 128 * 128 * (4096 + 64) * (1 + 0.25 * 64 * (2 / 128)) / 10e12
    assert gemm_base(1, 2561, 1280, 4096, 10, 100e12, 64, 0.25) == pytest.approx(min(11 * per_tile, 21 * small))


def test_split_k_fills_idle_sms():
    # 64 x 128: one 64x128 tile (1 + 0.25 x 64 x (1/64 + 1/128) = 1.375) on 10 SMs: K split in 10 (4096 // 256
    # allows 16), one wave of 10 parts of 409.6; a 32x32 grid (8 tiles, 2.0x) splits K in 1 part per tile
    one = 2 * 64 * 128 * (4096 / 10 + 64) * 1.375 / 10e12
    assert gemm_base(1, 64, 128, 4096, 10, 100e12, 64, 0.25) == pytest.approx(one)


def test_gemm_time_is_launch_plus_the_larger_roof():
    k = tables.gemm_kernel(1, 2560, 1280, 4096)
    compute = float(gemm_base(1, 2560, 1280, 4096, 10, 100e12, 64, 0.25)) / 0.8
    assert shaped_time(k, GPU) == pytest.approx(2e-6 + compute)
    v = tables.gemm_kernel(1, 1, 8192, 8192)  # a GEMV: its weight's 128 MiB at 0.9 TB/s
    assert shaped_time(v, GPU) == pytest.approx(2e-6 + 2 * (8192 + 8192 * 8192 + 8192) / 0.9e12)


def test_flash_blocks_by_hand():
    # 256 queries and keys, causal: two blocks of 128 rows seeing 1..128 and 129..256 keys: 8256 and 24640
    # scores; 4 heads -> 131584 in all over 10 SMs, the largest block 24640
    assert flash_work(4, 256, 256, True, False, 10) == pytest.approx(max(4 * (8256 + 24640) / 10, 24640))
    # without the mask each block sees all 256 keys: 8 blocks of 32768 scores over 10 SMs, at least one block
    assert flash_work(4, 256, 256, False, False, 10) == pytest.approx(max(4 * 2 * 128 * 256 / 10, 128 * 256))
    assert flash_work(40, 256, 256, False, False, 10) == pytest.approx(40 * 2 * 128 * 256 / 10)
    # 128 queries after 256 cached keys: one block of rows seeing 257..384 keys
    assert flash_work(1, 128, 384, True, False, 10) == pytest.approx(128 * 256 + 128 * 129 / 2)
    # backward blocks over keys: the same scores in all
    assert 10 * flash_work(64, 1024, 1024, True, True, 10) == pytest.approx(64 * 1024 * 1025 / 2)


def test_a_causal_flash_kernel_takes_about_half_the_full_ones_time():
    full = tables.flash_kernel(False, 8, 32, 8, 128, 8192, 8192, False)
    causal = tables.flash_kernel(False, 8, 32, 8, 128, 8192, 8192, True)
    assert full.flops == causal.flops  # the FLOPs counted do not change, the time does
    ratio = (shaped_time(causal, GPU) - 2e-6) / (shaped_time(full, GPU) - 2e-6)
    assert ratio == pytest.approx(8193 / 16384, rel=1e-3)
    # forward: 4 x d FLOPs per score at 0.6 of 10 TFLOPS per SM
    scores = 8 * 32 * 8192 * 8192 / 10
    assert shaped_time(full, GPU) == pytest.approx(2e-6 + scores * 4 * 128 / (10e12 * 0.6))


def test_memory_bound_kernels_at_their_bandwidth():
    assert shaped_time(tables.memory_kernel(10**9), GPU) == pytest.approx(2e-6 + 1e9 / 0.9e12)
    assert shaped_time(tables.memory_kernel(10**9, norm=True), GPU) == pytest.approx(2e-6 + 1e9 / 0.5e12)


def _synthetic(params):
    gpu = dataclasses.replace(GPU, parameters=params)
    kernels = [tables.gemm_kernel(1, m, n, k) for m in (16, 256, 2048, 4096) for n in (1024, 5120)
               for k in (512, 4096)]
    kernels += [tables.memory_kernel(n, norm=norm) for n in (10**5, 10**7, 10**9) for norm in (False, True)]
    kernels += [tables.flash_kernel(bwd, 2, 16, 16, 128, s, s, True) for s in (1024, 4096) for bwd in (False, True)]
    return [(k, shaped_time(k, gpu)) for k in kernels]


def test_the_fit_recovers_known_parameters():
    true = {**PARAMS, "gemm_k_half": 96.0, "gemm_tile_cost": 0.5, "gemm_efficiency": 0.7, "hbm_efficiency": 0.8,
            "launch_us": 3.0}
    got = shaped.fit(_synthetic(true), GPU)
    assert set(got) == set(true)
    for key, value in true.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key


def test_the_fit_keeps_what_the_samples_cannot_tell():
    one_k = [(tables.gemm_kernel(1, m, 4096, 4096), 1e-3 * m / 4096) for m in (1024, 2048, 4096)]
    got = shaped.fit(one_k, GPU)
    assert "gemm_k_half" not in got and "flash_fwd_efficiency" not in got and "gemm_efficiency" in got


def test_tables_refuse_bad_rows_in_one_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("# a comment\nop,m,n,k,us\ngemm,16,16,16,1.5\ngemm,16,x,16,2\n")
    with pytest.raises(UsageError, match=r"t.csv:4: n 'x' is not a whole number"):
        tables.read_kernels(path)
    path.write_text("op,m,n,k,us\nconv,1,1,1,1\n")
    with pytest.raises(UsageError, match="op 'conv' is not a kernel; valid: gemm, flash_fwd, flash_bwd, memory, norm"):
        tables.read_kernels(path)
    path.write_text("op,m,n,k,us\ngemm,1,1,1,-1\n")
    with pytest.raises(UsageError, match="us '-1' must be a positive finite number"):
        tables.read_kernels(path)
    path.write_text("op,ranks,ranks_per_node,bytes,us\nall_reduce,6,4,1024,10\n")
    with pytest.raises(UsageError, match="ranks 6 with ranks_per_node 4"):
        tables.read_collectives(path)


def test_calibrate_from_a_table_writes_the_fitted_gpu_and_each_points_error(tmp_path, capsys):
    true = {**PARAMS, "gemm_efficiency": 0.75, "launch_us": 4.0}
    lines = ["# made by the shaped model with known parameters",
             "op,dtype,batch,m,n,k,heads,kv_heads,head_dim,seq_q,seq_k,causal,bytes,us,name"]
    for k, seconds in _synthetic(true):
        if k.is_flash:
            s = k.letters["s"]
            op = "flash_fwd" if k.fn == "flash_attention" else "flash_bwd"
            lines.append(f"{op},bf16,2,,,,16,16,128,{s},{s},1,,{seconds * 1e6!r},attention {s}")
        elif k.gemm() is not None:
            g = k.gemm()
            lines.append(f"gemm,bf16,1,{g.m},{g.n},{g.k},,,,,,,,{seconds * 1e6!r},gemm")
        else:
            op = "norm" if k.kind == "norm" else "memory"
            lines.append(f"{op},bf16,,,,,,,,,,,{k.bytes},{seconds * 1e6!r},{op}")
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    gpu = tmp_path / "gpu.json"
    from stage_core.api import hardware
    hardware.save(dataclasses.replace(next(h for h in plugin.stage_hardware() if h.name == "a100"),
                                      gpu=dataclasses.replace(GPU, parameters=PARAMS)), gpu)
    out = tmp_path / "fitted.json"
    host = fresh_host((plugin, "hardware"))
    assert main(["calibrate", str(tmp_path / "t.csv"), "--gpu", str(gpu), "-o", str(out), "--points",
                 str(tmp_path / "p.csv")], host=host) == 0
    got = hardware.load(out).gpu.parameters
    assert got["gemm_efficiency"] == pytest.approx(0.75) and got["launch_us"] == pytest.approx(4.0)
    printed = capsys.readouterr().out
    assert "gemm small" in printed and "median error" in printed
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert rows[0] == "class,name,measured_us,model_us,error" and len(rows) == 1 + len(lines) - 2
    assert all(abs(float(r.rsplit(",", 1)[1])) < 1e-3 for r in rows[1:])
