"""``stage astrasim DIR``: simulate a set (or print how to), then print what it gave.

Simulating is :mod:`.simulate` (configs, one read of the set, the run, a result
record); this module is the command line and the printing.  :func:`run_astrasim` is
the whole command as a plain function; :func:`configure` and :func:`run` adapt it to
the core CLI's argparse (CommandSpec).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Mapping, TextIO

from stage_core.api import (PluginHost, Progress, UsageError, add_quiet_flag, check_output_file, stage_mark,
                            write_output)

from . import backends, outcome, report, runner, serving, simulate, steptime, timeline
from .configs import DEFAULT_PRESET

HELP = "run a trace set through ASTRA-sim (analytical or htsim network) and report per-rank times"


def configure(p: argparse.ArgumentParser) -> None:
    """Add the command's arguments to its subparser."""
    p.add_argument("dir", metavar="DIR", help="trace set written by `stage generate`")
    p.add_argument("--backend", choices=sorted(backends.BACKENDS), default=None,
                   help="ASTRA-sim's network backend: analytical (congestion-unaware, the default), analytical-aware "
                        "(congestion-aware, one node at most) or htsim (packets over a fat tree; stops at 4 s of "
                        "simulated time); default: the one --astra-sim's file name says, else analytical")
    p.add_argument("--astra-sim", dest="astra_sim", metavar="BIN", default=None,
                   help="the backend's ASTRA-sim binary (default: $ASTRA_SIM_BIN, $ASTRA_SIM_AWARE_BIN or "
                        "$ASTRA_SIM_HTSIM_BIN by backend, else its binary on PATH; without one, print the command "
                        "to run)")
    p.add_argument("--system", metavar="PRESET|FILE", default=None,
                   help="hardware preset (see `stage plugins`), a hardware file, or your own "
                        "system.json (default: the hardware the set was timed for with "
                        f"`stage generate --gpu`, else {DEFAULT_PRESET})")
    p.add_argument("--network", metavar="FILE", default=None,
                   help="your own analytical network .yml (default: from the preset)")
    p.add_argument("--topology", metavar="FILE.topo", default=None,
                   help="htsim only: your own fat tree .topo with one node per rank (default: written from the "
                        "preset)")
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
    add_quiet_flag(p)


def run(args: argparse.Namespace) -> int:
    """CommandSpec.run: UsageError propagates to the CLI (exit 2)."""
    return run_astrasim(args.dir, astra_sim=args.astra_sim, system=args.system,
                        network=args.network, as_json=args.json,
                        host=getattr(args, "stage_host", None), validate=args.validate,
                        timeline_file=args.timeline, plot_file=args.plot, backend=args.backend,
                        topology=args.topology, force=args.force, progress=Progress.for_args(args))


def run_astrasim(trace_dir: str | Path, *, astra_sim: str | None = None,
                 system: str | None = None, network: str | None = None,
                 as_json: bool = False, out: TextIO | None = None,
                 err: TextIO | None = None,
                 env: Mapping[str, str] | None = None,
                 host: PluginHost | None = None, validate: bool = True,
                 timeline_file: str | None = None, plot_file: str | None = None,
                 breakdown: bool = True, backend: str | None = None, topology: str | None = None,
                 force: bool = False, progress: Progress | None = None) -> int:
    """The command.  Returns 0 when every rank finished (or there is no binary: the
    command to run is printed), else 1 (a deadlock, a time limit, a failed simulator).

    Presets are the hardware records of ``host``'s plugins (default: every installed
    plugin).  A set timed by ``stage generate --gpu`` runs with the roofline off (the
    simulator replays the durations) and, unless ``system`` says otherwise, on the
    hardware it was timed for.  ``backend``: analytical, analytical-aware or htsim
    (default: the one ``astra_sim``'s file name says, else analytical).

    Per rank class it reports the step time, model TFLOP/s per GPU and MFU, and
    compute, exposed communication and bubble from the simulator's per-node log (one
    rank per class; the log is asked for when it stays under ``simulate.LOG_AUTO_LIMIT`` bytes,
    or always with ``timeline_file`` / ``plot_file``; never with ``breakdown=False``).

    Raises :class:`stage_core.errors.UsageError` for a bad DIR, preset, file, world
    size, binary, or a set the backend cannot run.  With ``validate`` (the default) the
    set is read and checked first, so a damaged one never reaches the simulator: a
    StageError (exit status 1) names the file, rank and byte, or the set's problems.
    ``timeline_file`` or ``plot_file`` without a simulator to run is a UsageError (they
    draw a run), before anything is written.  ``progress`` shows reading the set and the
    run (default: nothing).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    if plot_file:
        _check_plot_available()
    # the files the user names follow the core's output rule, checked before the run
    rule = dict(inputs=[Path(trace_dir).expanduser().resolve()], force=force)
    for flag, path in (("--timeline", timeline_file), ("--plot", plot_file)):
        if path:
            check_output_file(path, flag, **rule)
    drawing = [f"{flag} {path}" for flag, path in (("--timeline", timeline_file), ("--plot", plot_file)) if path]
    if drawing:  # (they draw a run: without a simulator there is nothing to draw)
        chosen = backends.named(backend, astra_sim)
        if runner.find_binary(chosen, astra_sim, os.environ if env is None else env) is None:
            raise UsageError(f"{drawing[0]}: draws the simulated step, and there is no ASTRA-sim {chosen.name} "
                             f"binary to run (--astra-sim BIN, ${chosen.env_var}, or {chosen.path_names[0]} on "
                             "PATH); nothing was written")
    log = True if (timeline_file or plot_file) else (None if breakdown else False)
    prep = simulate.prepare(trace_dir, backend=backend, astra_sim=astra_sim, system=system, network=network,
                            topology=topology, host=host or PluginHost(), env=env, validate=validate, log=log,
                            details=bool(drawing), progress=progress)
    if prep.binary is None:
        return _print_command(prep, as_json, out)

    print(f"running {prep.binary} ({prep.backend.name}) on {prep.traces.world_size} ranks "
          f"(system {prep.configs.system_source}, network {prep.configs.network_source}"
          + (f", topology {prep.meta['topology']}" if "topology" in prep.meta else "")
          + f"); kernels: {prep.meta['kernel_times']}", file=err)
    for note in prep.notes:
        print(f"note: {note}", file=err)
    done = simulate.run(prep)
    drawn = done.drawn()
    if timeline_file:  # (otherData first: the mark that lets a rerun replace it)
        events = {"otherData": stage_mark(), **timeline.trace_events(drawn, done.details)}
        write_output(timeline_file, json.dumps(events) + "\n", "--timeline", **rule)
    if plot_file:
        timeline.plot(drawn, Path(plot_file), title=_title(prep.traces.manifest, prep.traces.root.name),
                      details=done.details, **rule)

    if as_json:
        out.write(json.dumps(done.results, indent=2) + "\n")
    else:
        out.write(report.format_table(done.ranks, prep.traces.world_size) + "\n")
        if done.rows:
            out.write(steptime.format_classes(done.rows, done.job) + "\n")
        out.write(report.format_summary(done.results) + "\n")
        if "serving" in done.results:
            out.write(serving.format_serving(done.results["serving"]) + "\n")
        out.write(f"results: {prep.work / simulate.RESULTS_FILE}\n")
        for path in (timeline_file, plot_file):
            if path:
                out.write(f"timeline: {path}\n")
    if not done.finished and done.outcome.status != outcome.DEADLOCK:
        print(f"error: {done.outcome.message}", file=err)
    return 0 if done.finished else 1


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


def _print_command(prep: simulate.Prepared, as_json: bool, out: TextIO) -> int:
    backend = prep.backend
    line = runner.command_line(prep.paths, backend=backend)
    if as_json:
        payload = {**prep.meta, "configs": str(prep.work), "command": line,
                   "argv": runner.argv(runner.PLACEHOLDER.format(name=backend.name), prep.paths)}
        out.write(json.dumps(payload, indent=2) + "\n")
        return 0
    out.write(f"kernels: {prep.meta['kernel_times']}\n"
              f"ASTRA-sim configs written to {prep.work}\n"
              f"No simulator given (--astra-sim BIN, ${backend.env_var}, or "
              f"{backend.path_names[0]} on PATH). Run"
              + (" in an empty folder (htsim writes ./log, ./logout.dat and ./idmap.txt)" if backend is backends.HTSIM
                 else "") + ":\n\n"
              f"{line}\n\n"
              f"(the binary is {backend.build_path} in an astra-sim build; "
              f"then pass it with --astra-sim to parse the results)\n")
    return 0
