"""``stage astrasim DIR``: configs, run (or print how to run), parse, report.

:func:`run_astrasim` is the whole command as a plain function; :func:`configure` and
:func:`run` adapt it to the core CLI's argparse (CommandSpec).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from typing import Mapping, TextIO

from stage_core.api import (PluginHost, StageError, TraceError, UsageError, check_output_file, hardware, read_trace_set,
                            stage_mark, write_output)
from stage_core.api import validate_trace_set as validate_set

from . import files, parser, report, runner, steptime, timeline
from .configs import DEFAULT_PRESET, MEMORY_FILE, NETWORK_FILE, SYSTEM_FILE, build_configs
from .traceset import open_trace_set

#: above this estimate of the per-node log, the breakdown is left out unless
#: --timeline or --plot asks for the log
LOG_AUTO_LIMIT = 1 << 30

OUT_DIR = "astrasim"
RESULTS_FILE = "results.json"

HELP = "run a trace set through the ASTRA-sim analytical simulator and report per-rank times"


def configure(p: argparse.ArgumentParser) -> None:
    """Add the command's arguments to its subparser."""
    p.add_argument("dir", metavar="DIR", help="trace set written by `stage generate`")
    p.add_argument("--astra-sim", dest="astra_sim", metavar="BIN", default=None,
                   help=f"ASTRA-sim analytical binary (default: ${runner.ENV_VAR}, else "
                        f"{runner.PATH_NAMES[0]} or {runner.PATH_NAMES[1]} on PATH; "
                        "without one, print the command to run)")
    p.add_argument("--system", metavar="PRESET|FILE", default=None,
                   help="hardware preset (see `stage plugins`), a hardware file, or your own "
                        "system.json (default: the hardware the set was timed for with "
                        f"`stage generate --gpu`, else {DEFAULT_PRESET})")
    p.add_argument("--network", metavar="FILE", default=None,
                   help="your own analytical network .yml (default: from the preset)")
    p.add_argument("--json", action="store_true",
                   help="print results.json instead of the table")
    p.add_argument("--no-validate", dest="validate", action="store_false",
                   help="skip checking the set before the simulator reads it (a damaged set can make "
                        "ASTRA-sim abort or hang)")
    p.add_argument("--timeline", metavar="FILE",
                   help="write the simulated step as Chrome/Perfetto trace-event JSON (one rank per class, "
                        "a track per stream; open it in ui.perfetto.dev)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the same timeline with matplotlib (pip install 'stage-adapter-astrasim[plot]')")
    p.add_argument("--force", action="store_true",
                   help="replace the --timeline or --plot file even if STAGE did not write it (never a device, "
                        "a link or a file of a trace set)")


def run(args: argparse.Namespace) -> int:
    """CommandSpec.run: UsageError propagates to the CLI (exit 2)."""
    return run_astrasim(args.dir, astra_sim=args.astra_sim, system=args.system,
                        network=args.network, as_json=args.json,
                        host=getattr(args, "stage_host", None), validate=args.validate,
                        timeline_file=args.timeline, plot_file=args.plot, force=args.force)


def run_astrasim(trace_dir: str | Path, *, astra_sim: str | None = None,
                 system: str | None = None, network: str | None = None,
                 as_json: bool = False, out: TextIO | None = None,
                 err: TextIO | None = None,
                 env: Mapping[str, str] | None = None,
                 host: PluginHost | None = None, validate: bool = True,
                 timeline_file: str | None = None, plot_file: str | None = None,
                 breakdown: bool = True, force: bool = False) -> int:
    """The command.  Returns 0, or 1 when ranks deadlocked or the simulator failed.

    Presets are the hardware records of ``host``'s plugins (default: every installed
    plugin).  A set timed by ``stage generate --gpu`` runs with the roofline off (the
    simulator replays the durations) and, unless ``system`` says otherwise, on the
    hardware it was timed for.

    Per rank class it reports the step time, model TFLOP/s per GPU and MFU, and
    compute, exposed communication and bubble from the simulator's per-node log (one
    rank per class; the log is asked for when it stays under ``LOG_AUTO_LIMIT`` bytes,
    or always with ``timeline_file`` / ``plot_file``; never with ``breakdown=False``).

    Raises :class:`stage_core.errors.UsageError` for a bad DIR, preset, file, world
    size or binary.  With ``validate`` (the default) the set is read and checked first,
    so a damaged one never reaches the simulator: a StageError (exit status 1) names the
    file, rank and byte, or the set's problems.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    env = os.environ if env is None else env
    host = host or PluginHost()

    traces = open_trace_set(trace_dir)
    presets = {h.name: h for h in host.hardware()}
    timed_for = traces.manifest.get("hardware")
    if isinstance(timed_for, dict):
        timed_hw = hardware.from_dict(timed_for, f"{traces.root / 'manifest.json'}: hardware")
        presets.setdefault(timed_hw.name, timed_hw)
        system = system or timed_hw.name
    if plot_file:
        _check_plot_available()
    # the files the user names follow the core's output rule, checked before the run
    rule = dict(inputs=[traces.root], force=force)
    for flag, path in (("--timeline", timeline_file), ("--plot", plot_file)):
        if path:
            check_output_file(path, flag, **rule)
    binary = runner.find_binary(astra_sim, env)  # fail on a bad binary before writing
    if validate:
        check_set(host, traces.root)
    log = binary is not None and (bool(timeline_file or plot_file)
                                  or (breakdown and traces.log_estimate() <= LOG_AUTO_LIMIT))
    configs = build_configs(traces.world_size, system, network, presets=presets,
                            timed=traces.timed, trace=log)
    if binary is not None:
        check_first_kernels(host, traces, json.loads(configs.system_text))

    work = traces.root / OUT_DIR
    texts = {SYSTEM_FILE: configs.system_text, NETWORK_FILE: configs.network_text,
             MEMORY_FILE: configs.memory_text}
    if log:
        texts[timeline.LOGGING_FILE] = timeline.logging_config(work / timeline.LOG_FILE)
    files.write_folder(work, texts)
    paths = runner.SimPaths(workload=traces.workload_prefix, comm_groups=traces.comm_groups,
                            system=work / SYSTEM_FILE, network=work / NETWORK_FILE,
                            memory=work / MEMORY_FILE,
                            logging=work / timeline.LOGGING_FILE if log else None)
    meta = {"trace_dir": str(traces.root), "system": configs.system_source,
            "network": configs.network_source}

    if binary is None:
        return _print_command(paths, work, meta, as_json, out)

    print(f"running {binary} on {traces.world_size} ranks "
          f"(system {configs.system_source}, network {configs.network_source})", file=err)
    outcome = runner.run(binary, paths, work)
    with open(outcome.stdout_path, errors="replace") as handle:
        ranks = parser.parse_lines(handle)
    meta = {**meta, "astra_sim": str(binary), "returncode": outcome.returncode}
    results = report.build_results(ranks, traces.world_size, meta)
    classes = traces.manifest.get("rank_classes", [])
    shown = {}
    if log and classes and (work / timeline.LOG_FILE).is_file():
        with open(work / timeline.LOG_FILE, errors="replace") as handle:
            shown = timeline.read_log(handle, set(timeline.representatives(classes)))
    peak = configs.preset.gpu.peak_flops("bf16") if configs.preset else None
    rows = steptime.class_results(traces.manifest, ranks, shown, peak)
    job = steptime.job_results(traces.manifest, results["summary"]["max_finish_time_ns"], peak)
    if rows:
        results["rank_classes"] = rows
        results["summary"].update(job)
    files.write_file(work / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    drawn = [(timeline.class_label(i, rc["ranks"], report.rank_ranges), rc["ranks"][0], shown[rc["ranks"][0]])
             for i, rc in enumerate(classes) if rc["ranks"][0] in shown]
    if timeline_file:  # (otherData first: the mark that lets a rerun replace it)
        events = {"otherData": stage_mark(), **timeline.trace_events(drawn)}
        write_output(timeline_file, json.dumps(events) + "\n", "--timeline", **rule)
    if plot_file:
        timeline.plot(drawn, Path(plot_file), title=_title(traces.manifest, traces.root.name), **rule)

    if as_json:
        out.write(json.dumps(results, indent=2) + "\n")
    else:
        out.write(report.format_table(ranks, traces.world_size) + "\n")
        if rows:
            out.write(steptime.format_classes(rows, job) + "\n")
        out.write(report.format_summary(results) + "\n")
        out.write(f"results: {work / RESULTS_FILE}\n")
        for path in (timeline_file, plot_file):
            if path:
                out.write(f"timeline: {path}\n")

    if outcome.returncode != 0:
        print(f"error: ASTRA-sim exited with status {outcome.returncode}; see "
              f"{outcome.stderr_path} and {outcome.stdout_path}", file=err)
        return 1
    return 1 if results["summary"]["deadlock"] else 0


def check_set(host: PluginHost, root: Path) -> None:
    """Read and validate the set at ``root`` with the core's validator, through the
    installed backend that reads it (none installed: nothing to check with)."""
    if not any(b.read and b.detect and b.detect(root) for b in host.backends()):
        return
    problems = validate_set(read_trace_set(host, root))
    if problems:
        raise TraceError([str(p) for p in problems])


def check_first_kernels(host: PluginHost, traces, system: Mapping) -> None:
    """Refuse, in one line, a set whose first kernel on some rank class takes 0 ns on
    this roofline: the simulator would abort at its first tick (:data:`hardware.TICK_ZERO`).

    Only a roofline run can hit it (a timed set's nodes last at least 1 ns); one rank
    of each class is read, as far into the set as the last of them.
    """
    if not system.get("roofline-enabled") or not isinstance(system.get("peak-perf"), (int, float)) \
            or not isinstance(system.get("local-mem-bw"), (int, float)):
        return
    classes = traces.manifest.get("rank_classes") or []
    wanted = {rc["ranks"][0]: rc["ranks"] for rc in classes if rc.get("ranks")}
    if not wanted or not any(b.read and b.detect and b.detect(traces.root) for b in host.backends()):
        return
    for rank, nodes in read_trace_set(host, traces.root).iter_ranks():
        if rank not in wanted:
            continue
        node = hardware.first_kernel(nodes)
        if node is not None:
            ops, size = node.attr("num_ops", 0), node.attr("tensor_size", 0)
            if hardware.roofline_ns(ops, size, system["peak-perf"], system["local-mem-bw"]) == 0:
                raise StageError(
                    f"ranks {report.rank_ranges(wanted[rank])}: the first kernel, node {node.id} ({node.name}, "
                    f"{ops} FLOPs, {size} bytes), takes under 1 ns on this roofline "
                    f"({system['peak-perf']} TFLOPS, {system['local-mem-bw']} GB/s), and {hardware.TICK_ZERO}; "
                    "generate the set with --gpu NAME (timed kernels last at least 1 ns) or a larger batch")
        del wanted[rank]
        if not wanted:
            return


def _title(manifest: Mapping, fallback: str) -> str:
    model, plan = manifest.get("model", {}), manifest.get("plan", {})
    degrees = " ".join(f"{a}{plan[a]}" for a in ("tp", "cp", "ep", "dp", "pp") if plan.get(a, 1) > 1)
    what = f"{model.get('name', fallback)} {degrees}".strip()
    if plan.get("micro_batches"):
        what += f", {plan['micro_batches']} micro-batches"
    hw = manifest.get("hardware", {}).get("name")
    return f"{what}{f' on {hw}' if hw else ''}: the simulated step, one rank per class"


def _check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib, an optional extra of this adapter: "
                         "pip install 'stage-adapter-astrasim[plot]'") from None


def _print_command(paths: runner.SimPaths, work: Path, meta: dict, as_json: bool,
                   out: TextIO) -> int:
    line = runner.command_line(paths)
    if as_json:
        payload = {**meta, "configs": str(work), "command": line,
                   "argv": runner.argv(runner.PLACEHOLDER, paths)}
        out.write(json.dumps(payload, indent=2) + "\n")
        return 0
    out.write(f"ASTRA-sim configs written to {work}\n"
              f"No simulator given (--astra-sim BIN, ${runner.ENV_VAR}, or "
              f"{runner.PATH_NAMES[0]} on PATH). Run:\n\n"
              f"{line}\n\n"
              f"(the binary is {runner.CONVENTIONAL_PATH} in an astra-sim build; "
              f"then pass it with --astra-sim to parse the results)\n")
    return 0


# --------------------------------------------------------------------------- the stage_simulators record


def available(env: Mapping[str, str] | None = None) -> str | None:
    """None when an ASTRA-sim binary is found (``$ASTRA_SIM_BIN``, else on PATH), else why not."""
    try:
        binary = runner.find_binary(None, os.environ if env is None else env)
    except UsageError as exc:
        return str(exc)
    if binary is None:
        return (f"no ASTRA-sim analytical binary: set ${runner.ENV_VAR} or put {runner.PATH_NAMES[0]} on PATH "
                f"(…/{runner.CONVENTIONAL_PATH} in an astra-sim build)")
    return None


def simulate(directory: Path, hw=None, host: PluginHost | None = None) -> dict:
    """Run the set in ``directory`` on ``hw`` (None: the hardware it was timed for) and return
    ``{"step_time_s", "finished", "results"}`` (results: what results.json holds)."""
    reason = available()
    if reason:
        raise UsageError(reason)
    host = host or PluginHost()
    system = None
    if hw is not None:
        system = hw.name if hw in host.hardware() else None
        if system is None:
            system = str(Path(directory) / OUT_DIR / "hardware.json")
            hardware.save(hw, Path(system), "--system", within_set=True, force=True)
    out, err = io.StringIO(), io.StringIO()
    status = run_astrasim(directory, system=system, as_json=True, out=out, err=err, host=host, validate=False,
                          breakdown=False)
    results = json.loads(out.getvalue())
    summary = results.get("summary", {})
    if "max_finish_time_ns" not in summary:
        raise StageError(f"ASTRA-sim did not run the set in {directory}: {err.getvalue().strip()[-300:]}")
    finish = summary["max_finish_time_ns"]
    return {"step_time_s": None if finish is None else finish * 1e-9,
            "finished": status == 0 and not summary.get("deadlock"), "results": results}
