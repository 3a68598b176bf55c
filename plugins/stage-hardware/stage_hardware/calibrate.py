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

from stage_core.api import PluginHost, UsageError, hardware

from . import kineto

HELP = "fit a GPU's compute-model parameters to a PyTorch profiler (Kineto) trace; write a hardware file"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", metavar="PROFILE.json",
                   help="torch.profiler trace (export_chrome_trace, record_shapes=True; .json or .json.gz)")
    p.add_argument("--gpu", required=True, metavar="NAME|FILE",
                   help="the hardware preset (or file) the profile ran on: its datasheet and starting parameters")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the hardware file to write (JSON)")


def run(args: argparse.Namespace) -> int:
    host = getattr(args, "stage_host", None) or PluginHost()
    return calibrate(host, Path(args.profile), args.gpu, Path(args.output))


def calibrate(host: PluginHost, profile: Path, gpu: str, output: Path, out=print) -> int:
    hw = hardware.resolve(host, gpu)
    model = host.compute_model(hw.gpu.compute_model, hw.gpu.name)
    if model.fit is None:
        raise UsageError(f"--gpu {gpu}: its compute model {model.name!r} has no parameters to fit; "
                         f"use a GPU whose compute model can be calibrated (calibrated)")
    if output.exists() and not output.is_file():
        raise UsageError(f"-o {output}: exists and is not a file")
    found = kineto.read(profile)
    if not found.samples:
        raise UsageError(f"{profile}: no GPU kernel maps to an operator with recorded shapes "
                         "(profile with record_shapes=True and CUDA activities)")
    try:
        fitted = model.fit(found.samples, hw.gpu)
    except ValueError as exc:
        raise UsageError(f"{profile}: {exc}") from None
    source = f"fit by stage calibrate to {len(found.samples)} operators of {profile.name}"
    gpu_spec = dataclasses.replace(
        hw.gpu, parameters={**hw.gpu.parameters, **fitted},
        sources={**hw.gpu.sources, **{name: source for name in fitted}})
    result = dataclasses.replace(hw, name=output.stem, description=f"{hw.description}, calibrated on {profile.name}",
                                 gpu=gpu_spec)
    hardware.save(result, output)
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
