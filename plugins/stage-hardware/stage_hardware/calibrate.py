"""``stage calibrate PROFILE.json|TABLE.csv --gpu NAME -o FILE``: a GPU's compute-model
parameters fitted to measured kernels.

The kernels come from a real profile (:mod:`.kineto`) or a table of measured kernel times
(:mod:`.tables`); they are fitted by the GPU's compute model (``ComputeModelSpec.fit``);
the parameters they determine replace the preset's, each with its new source, the others
stay.  The result is a hardware file that ``stage generate --gpu FILE`` and ``stage
astrasim --system FILE`` take.  Every point's error under the fitted model is printed
(summarised per kernel class, the worst listed) and, with ``--points FILE``, written.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from stage_core.api import PluginHost, UsageError, check_output_file, hardware, write_output

from . import compute, kineto, shaped, tables

#: which kernels fixed each parameter, per compute model (what a refusal names)
FITTED_BY = {"calibrated": compute.fitted_by, "shaped": shaped.fitted_by}

HELP = ("fit a GPU's compute-model parameters to a PyTorch profiler (Kineto) trace or a table of measured kernel "
        "times; write a hardware file")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", metavar="PROFILE.json|TABLE.csv",
                   help="torch.profiler trace (export_chrome_trace, record_shapes=True; .json or .json.gz), or a CSV "
                        "table of measured kernel times (columns op,dtype,batch,m,n,k,heads,kv_heads,head_dim,seq_q,"
                        "seq_k,causal,bytes,us,name; op gemm, flash_fwd, flash_bwd, memory or norm), or a CSV table "
                        "of measured collective times (op,ranks,ranks_per_node,bytes,us,name; op all_reduce, "
                        "all_gather, reduce_scatter, all_to_all or send): the links are fitted then")
    p.add_argument("--gpu", required=True, metavar="NAME|FILE",
                   help="the hardware preset (or file) the profile ran on: its datasheet and starting parameters")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the hardware file to write (JSON)")
    p.add_argument("--points", metavar="FILE.csv",
                   help="also write each measured point with the fitted model's time and its error (CSV)")
    p.add_argument("--force", action="store_true",
                   help="replace FILE even if STAGE did not write it (never the profile or the --gpu file)")


def run(args: argparse.Namespace) -> int:
    host = getattr(args, "stage_host", None) or PluginHost()
    return calibrate(host, Path(args.profile), args.gpu, Path(args.output), force=args.force,
                     points=Path(args.points) if args.points else None)


def calibrate(host: PluginHost, profile: Path, gpu: str, output: Path, out=print, force: bool = False,
              points: Path | None = None) -> int:
    hw = hardware.resolve(host, gpu)
    if profile.suffix.lower() == ".csv" and tables.kind_of(profile) == "collectives":
        return calibrate_links(hw, profile, gpu, output, out, force, points)
    model = host.compute_model(hw.gpu.compute_model, hw.gpu.name)
    if model.fit is None:
        raise UsageError(f"--gpu {gpu}: its compute model {model.name!r} has no parameters to fit; "
                         f"use a GPU whose compute model can be calibrated (shaped, calibrated)")
    inputs = [profile] + ([Path(gpu)] if Path(gpu).is_file() else [])
    rule = dict(inputs=inputs, force=force)
    check_output_file(output, "-o", **rule)  # before the work: never the profile, a device, a user's file
    if points is not None:
        check_output_file(points, "--points", **rule)
    found, labels = _measured(profile)
    try:
        fitted = model.fit(found.samples, hw.gpu)
    except ValueError as exc:
        raise UsageError(f"{profile}: {exc}") from None
    _check_physical(fitted, found, hw, profile, model.name)
    source = f"fit by stage calibrate to {len(found.samples)} {'operators' if labels is None else 'kernels'} of " \
             f"{profile.name}"
    gpu_spec = dataclasses.replace(
        hw.gpu, parameters={**hw.gpu.parameters, **fitted},
        sources={**hw.gpu.sources, **{name: source for name in fitted}})
    result = dataclasses.replace(hw, name=output.stem, description=f"{hw.description}, calibrated on {profile.name}",
                                 gpu=gpu_spec)
    hardware.save(result, output, "-o", **rule)
    share = found.mapped_seconds / found.kernel_seconds if found.kernel_seconds else 0.0
    counts = ", ".join(f"{n} {cls}" for cls, n in sorted(kineto.classes(found.samples).items()))
    if labels is None:
        out(f"{profile.name}: {len(found.samples)} operators ({counts}), {100 * share:.1f}% of the compute "
            f"kernels' time")
    else:
        classes: dict[str, int] = {}
        for k, _ in found.samples:
            classes[kernel_class(k)] = classes.get(kernel_class(k), 0) + 1
        out(f"{profile.name}: {len(found.samples)} kernels "
            f"({', '.join(f'{n} {cls}' for cls, n in sorted(classes.items()))})")
    if found.unmapped:
        worst = sorted(found.unmapped.items(), key=lambda kv: -kv[1])[:3]
        out("not mapped: " + ", ".join(f"{name} ({seconds * 1e3:.3f} ms)" for name, seconds in worst))
    for name in model.parameters:
        old = hw.gpu.parameters.get(name)
        new = gpu_spec.parameters.get(name)
        how = "fitted" if name in fitted else "kept (the profile does not fix it)"
        out(f"  {name:<22} {old!s:>10} -> {new:.4g}  {how}" if new is not None else f"  {name:<22} -")
    return _finish(point_errors(found.samples, labels, model.time, gpu_spec), points, output, "--gpu", out, rule)


def _finish(rows, points: Path | None, output: Path, use: str, out, rule) -> int:
    """Each point's error summarised (and, with ``points``, written); what was written."""
    for line in error_summary(rows):
        out(line)
    if points is not None:
        write_points(rows, points, **rule)
        out(f"wrote {points} (each point's measured and modelled time)")
    out(f"wrote {output} (use it with {use} {output})")
    return 0


def calibrate_links(hw, table: Path, gpu: str, output: Path, out, force: bool, points: Path | None) -> int:
    """A collective table: the links' efficiency and latency that make ASTRA-sim's analytical
    network nearest the measured times (:mod:`.links`)."""
    from . import links  # (the core's copy of the simulator's network)

    rule = dict(inputs=[table] + ([Path(gpu)] if Path(gpu).is_file() else []), force=force)
    check_output_file(output, "-o", **rule)
    if points is not None:
        check_output_file(points, "--points", **rule)
    measured = tables.read_collectives(table)
    wide = [p for p in measured if p.ranks_per_node > hw.gpus_per_node]
    if wide:
        raise UsageError(f"{table}: {wide[0].ranks_per_node} GPUs per node in '{wide[0].name}', but --gpu {gpu} has "
                         f"{hw.gpus_per_node} GPUs per node")
    fitted_hw, fitted = links.fit(hw, measured)
    sources = dict(fitted_hw.sources)
    for tier, (efficiency, latency, error, count) in fitted.items():
        sources[tier] = (f"{getattr(hw, tier).name} {getattr(hw, tier).bandwidth_gbps:g} GB/s; efficiency "
                         f"{efficiency:g} and latency {latency:g} ns per link fit by stage calibrate to {count} "
                         f"collectives of {table.name}")
    result = dataclasses.replace(fitted_hw, name=output.stem, sources=sources,
                                 description=f"{hw.description}, links calibrated on {table.name}")
    hardware.save(result, output, "-o", **rule)
    out(f"{table.name}: {len(measured)} collectives ({sum(p.ranks == p.ranks_per_node for p in measured)} in one "
        f"node, {sum(p.ranks != p.ranks_per_node for p in measured)} across nodes)")
    for tier in ("scale_up", "scale_out"):
        old, new = getattr(hw, tier), getattr(fitted_hw, tier)
        how = (f"fitted to {fitted[tier][3]} points, mean error {100 * fitted[tier][2]:.1f}%" if tier in fitted
               else "kept (no point on this tier)")
        out(f"  {tier:<10} efficiency {old.efficiency:.4g} -> {new.efficiency:.4g}, latency {old.latency_ns:g} -> "
            f"{new.latency_ns:g} ns per link  {how}")
    rows = [(f"{p.op} {p.ranks} GPUs " + ("one node" if p.ranks == p.ranks_per_node else
                                          f"{p.ranks // p.ranks_per_node} nodes"),
             p.name or p.op, p.seconds, links.model_seconds(fitted_hw, p)) for p in measured]
    return _finish(rows, points, output, "--system", out, rule)


def _measured(source: Path) -> tuple[kineto.Profile, list[str] | None]:
    """The samples of a profile (labels None) or of a kernel table (each row's label)."""
    if source.suffix.lower() == ".csv":
        found = tables.read_kernels(source)
        total = sum(p.seconds for p in found)
        profile = kineto.Profile(samples=[(p.kernel, p.seconds) for p in found], kernel_seconds=total)
        return profile, [p.name or p.op for p in found]
    found = kineto.read(source)
    if not found.samples:
        raise UsageError(f"{source}: no GPU kernel maps to an operator with recorded shapes "
                         "(profile with record_shapes=True and CUDA activities)")
    return found, None


def point_errors(samples, labels, time, gpu) -> list[tuple[str, str, float, float]]:
    """(class, label, measured seconds, modelled seconds) per point."""
    rows = []
    for i, (k, seconds) in enumerate(samples):
        label = labels[i] if labels is not None else f"operator {i + 1}"
        rows.append((kernel_class(k), label, seconds, float(time(k, gpu))))
    return rows


def kernel_class(k) -> str:
    """A kernel's class in the error summaries: large and small GEMMs apart (10^11 FLOPs)."""
    if k.is_flash:
        return k.fn
    if k.gemm() is not None or k.matmul_flops:
        return "gemm large" if k.matmul_flops >= LARGE_GEMM_FLOPS else "gemm small"
    return "norm" if k.kind == "norm" else "memory-bound"


#: the FLOPs from which a GEMM counts as large in the summaries (about 0.3 ms on an A100)
LARGE_GEMM_FLOPS = 10**11


def error_summary(rows, worst: int = 3) -> list[str]:
    """Per class: points, the median and worst error of the model against the measurement."""
    lines = [f"  {'class':<22} {'points':>7} {'median error':>13} {'worst error':>12}  (model / measured - 1)"]
    by: dict[str, list] = {}
    for row in rows:
        by.setdefault(row[0], []).append(row)
    for cls, mine in sorted(by.items()):
        errors = sorted((model / seconds - 1 for _, _, seconds, model in mine), key=abs)
        median = errors[len(errors) // 2]
        lines.append(f"  {cls:<22} {len(mine):>7} {100 * abs(median):>12.1f}% {100 * errors[-1]:>+11.1f}%")
    ranked = sorted(rows, key=lambda r: -abs(r[3] / r[2] - 1))[:worst]
    for cls, label, seconds, model in ranked:
        lines.append(f"  worst: {label} ({cls}): measured {seconds * 1e6:,.1f} us, model {model * 1e6:,.1f} us "
                     f"({100 * (model / seconds - 1):+.1f}%)")
    return lines


def write_points(rows, path: Path, **rule) -> None:
    lines = ["class,name,measured_us,model_us,error"]
    for cls, label, seconds, model in rows:
        name = '"' + label.replace('"', "'") + '"'
        lines.append(f"{cls},{name},{seconds * 1e6:.3f},{model * 1e6:.3f},{model / seconds - 1:.4f}")
    write_output(path, "\n".join(lines) + "\n", "--points", **rule)


def _check_physical(fitted: dict, found: kineto.Profile, hw, profile: Path, model: str) -> None:
    """Refuse fitted parameters no GPU can have (an efficiency above 1: faster than the
    datasheet's peak or bandwidth; a negative, infinite or NaN number), naming the
    kernels that produced them: the profile ran on another GPU than --gpu, or its
    shapes are not what ran."""
    by = FITTED_BY[model](found.samples, hw.gpu, fitted) if model in FITTED_BY else {}
    peak = f"{hw.gpu.peak_flops('bf16') / 1e12:g} TFLOP/s bf16 peak"
    hbm = f"{hw.gpu.hbm_gbps:g} GB/s HBM bandwidth"
    limits = {"gemm_efficiency": peak, "flash_fwd_efficiency": peak, "flash_bwd_efficiency": peak,
              "hbm_efficiency": hbm, "norm_efficiency": hbm}
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
