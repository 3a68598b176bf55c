"""``stage calibrate PROFILE.json --gpu NAME -o FILE``: a GPU's compute-model parameters
fitted to a real profile.

The profile's kernels (:mod:`.kineto`) are fitted by the GPU's compute model
(``ComputeModelSpec.fit``); the parameters the profile determines replace the
preset's, each with its new source, the others stay.  The result is a hardware file
that ``stage generate --gpu FILE`` and ``stage astrasim --system FILE`` take.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from stage_core.api import PluginHost, UsageError, check_output_file, hardware

from . import kineto
from .compute import fitted_by

HELP = "fit a GPU's compute-model parameters to a PyTorch profiler (Kineto) trace; write a hardware file"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", metavar="PROFILE.json",
                   help="torch.profiler trace (export_chrome_trace, record_shapes=True; .json or .json.gz)")
    p.add_argument("--gpu", required=True, metavar="NAME|FILE",
                   help="the hardware preset (or file) the profile ran on: its datasheet and starting parameters")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the hardware file to write (JSON)")
    p.add_argument("--force", action="store_true",
                   help="replace FILE even if STAGE did not write it (never the profile or the --gpu file)")


def run(args: argparse.Namespace) -> int:
    host = getattr(args, "stage_host", None) or PluginHost()
    return calibrate(host, Path(args.profile), args.gpu, Path(args.output), force=args.force)


def calibrate(host: PluginHost, profile: Path, gpu: str, output: Path, out=print, force: bool = False) -> int:
    hw = hardware.resolve(host, gpu)
    model = host.compute_model(hw.gpu.compute_model, hw.gpu.name)
    if model.fit is None:
        raise UsageError(f"--gpu {gpu}: its compute model {model.name!r} has no parameters to fit; "
                         f"use a GPU whose compute model can be calibrated (calibrated)")
    inputs = [profile] + ([Path(gpu)] if Path(gpu).is_file() else [])
    rule = dict(inputs=inputs, force=force)
    check_output_file(output, "-o", **rule)  # before the work: never the profile, a device, a user's file
    found = kineto.read(profile)
    if not found.samples:
        raise UsageError(f"{profile}: no GPU kernel maps to an operator with recorded shapes "
                         "(profile with record_shapes=True and CUDA activities)")
    try:
        fitted = model.fit(found.samples, hw.gpu)
    except ValueError as exc:
        raise UsageError(f"{profile}: {exc}") from None
    _check_physical(fitted, found, hw, profile)
    source = f"fit by stage calibrate to {len(found.samples)} operators of {profile.name}"
    gpu_spec = dataclasses.replace(
        hw.gpu, parameters={**hw.gpu.parameters, **fitted},
        sources={**hw.gpu.sources, **{name: source for name in fitted}})
    result = dataclasses.replace(hw, name=output.stem, description=f"{hw.description}, calibrated on {profile.name}",
                                 gpu=gpu_spec)
    hardware.save(result, output, "-o", **rule)
    share = found.mapped_seconds / found.kernel_seconds if found.kernel_seconds else 0.0
    counts = ", ".join(f"{n} {cls}" for cls, n in sorted(kineto.classes(found.samples).items()))
    out(f"{profile.name}: {len(found.samples)} operators ({counts}), {100 * share:.1f}% of the compute "
        f"kernels' time")
    if found.unmapped:
        worst = sorted(found.unmapped.items(), key=lambda kv: -kv[1])[:3]
        out("not mapped: " + ", ".join(f"{name} ({seconds * 1e3:.3f} ms)" for name, seconds in worst))
    for name in model.parameters:
        old = hw.gpu.parameters.get(name)
        new = gpu_spec.parameters.get(name)
        how = "fitted" if name in fitted else "kept (the profile does not fix it)"
        out(f"  {name:<22} {old!s:>10} -> {new:.4g}  {how}" if new is not None else f"  {name:<22} -")
    out(f"wrote {output} (use it with --gpu {output})")
    return 0


def _check_physical(fitted: dict, found: kineto.Profile, hw, profile: Path) -> None:
    """Refuse fitted parameters no GPU can have (an efficiency above 1: faster than the
    datasheet's peak or bandwidth; a negative, infinite or NaN number), naming the
    kernels that produced them: the profile ran on another GPU than --gpu, or its
    shapes are not what ran."""
    by = fitted_by(found.samples, hw.gpu, fitted)
    peak = f"{hw.gpu.peak_flops('bf16') / 1e12:g} TFLOP/s bf16 peak"
    limits = {"gemm_efficiency": peak, "flash_fwd_efficiency": peak, "flash_bwd_efficiency": peak,
              "hbm_efficiency": f"{hw.gpu.hbm_gbps:g} GB/s HBM bandwidth"}
    wrong = []
    for name, value in fitted.items():
        problem = hardware.parameter_problem(name, value)
        if problem is None:
            continue
        classes = by.get(name, {})
        kernels = " and ".join(f"{n} {cls}" for cls, n in sorted(classes.items())) or "no"
        total = sum(classes.values())
        beyond = f" (beyond the {hw.gpu.name}'s {limits[name]})" if name in limits and value > 1 else ""
        wrong.append(f"the {kernels} kernel{'s' * (total != 1)} give {name} = {value:.4g}, which {problem}{beyond}")
    if wrong:
        raise UsageError(f"{profile}: {'; '.join(wrong)}; was the profile taken on --gpu {hw.name}, with "
                         f"record_shapes=True? Nothing was written")
