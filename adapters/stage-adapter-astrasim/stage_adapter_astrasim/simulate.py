"""Simulating a set: configs, one read of the set, the run, and a result record.

:func:`prepare` resolves the backend, its binary and the hardware, builds the configs
(and, for htsim, the fat tree), reads the set once (:mod:`.scan`) and writes the config
folder; :func:`run` runs the simulator and returns a :class:`SimRun`: per-rank results,
the outcome (:mod:`.outcome`), per-class step times and breakdown, and what
``results.json`` holds.  ``stage astrasim`` prints a SimRun; the ``stage_simulators``
records (search, sweeps, ``bench_confirm``) return its summary.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from stage_core.api import PluginHost, Progress, UsageError, hardware, netmodel
from stage_core.records import HardwareSpec

from . import backends, files, htsim, netyml, outcome, parser, report, runner, scan, serving, steptime, timeline
from .backends import Backend
from .configs import MEMORY_FILE, NETWORK_FILE, SYSTEM_FILE, Configs, build_configs
from .traceset import TraceSet, open_trace_set

#: above this estimate of the per-node log, the breakdown is left out unless asked for
LOG_AUTO_LIMIT = 1 << 30

OUT_DIR = "astrasim"
RESULTS_FILE = "results.json"


@dataclass
class Prepared:
    """A set ready to run: where everything is and what runs it."""

    traces: TraceSet
    backend: Backend
    binary: Path | None
    configs: Configs
    work: Path
    paths: runner.SimPaths
    meta: dict[str, Any]
    log: bool
    validated: bool
    #: what the backend's network is and what it cannot express (htsim)
    notes: tuple[str, ...] = ()
    #: per rank a timeline shows, what its nodes are ({rank: {node id: FLOPs, bytes, group...}})
    details: dict[int, dict[int, dict]] = field(default_factory=dict)
    progress: Any = None  # (stage_core.api.Progress: the run's phases shown)


def same_gpu(a, b) -> bool:
    """Whether two GPU records time kernels alike (a network may differ; the kernels may not)."""
    return (a.name, a.compute_model, dict(a.parameters), dict(a.matmul_tflops), a.hbm_gbps) == \
        (b.name, b.compute_model, dict(b.parameters), dict(b.matmul_tflops), b.hbm_gbps)


def kernel_timing(manifest: dict, system_json: dict, configs: Configs) -> dict[str, str]:
    """What times the set's kernels, for results.json and the first line: its compute model on its
    GPU, or (untimed) the simulator's roofline with the system's peak-perf and local-mem-bw."""
    if manifest.get("compute_model") and isinstance(manifest.get("hardware"), dict):
        return {"compute_model": manifest["compute_model"], "hardware": manifest["hardware"].get("name", ""),
                "kernel_times": f"{hardware.kernel_times(manifest)} (the set's durations)"}
    peak, bandwidth = system_json.get("peak-perf"), system_json.get("local-mem-bw")
    return {"compute_model": "roofline (the simulator's)",
            "hardware": configs.preset.name if configs.preset is not None else configs.system_source,
            "kernel_times": f"untimed: the simulator's roofline times every kernel (peak-perf {peak} TFLOPS, "
                            f"local-mem-bw {bandwidth} GB/s of {configs.system_source})"}


@dataclass
class SimRun:
    """What one run of the simulator gave."""

    prepared: Prepared
    returncode: int
    ranks: dict[int, parser.RankResult]
    outcome: outcome.Outcome
    results: dict[str, Any]
    rows: list[dict] = field(default_factory=list)
    job: dict = field(default_factory=dict)
    #: per rank class shown, its first rank's spans from the per-node log
    spans: dict[int, list[timeline.Span]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.outcome.ok

    @property
    def step_time_s(self) -> float | None:
        finish = self.results["summary"]["max_finish_time_ns"]
        return None if finish is None else finish * 1e-9

    @property
    def details(self) -> dict[int, dict[int, dict]]:
        return self.prepared.details

    def drawn(self) -> list[tuple[str, int, list[timeline.Span]]]:
        """(label, rank, spans) of each rank class the log shows, for the timeline."""
        classes = self.prepared.traces.manifest.get("rank_classes", [])
        return [(timeline.class_label(i, rc["ranks"], report.rank_ranges), rc["ranks"][0], self.spans[rc["ranks"][0]])
                for i, rc in enumerate(classes) if rc["ranks"][0] in self.spans]


def prepare(trace_dir: str | Path, *, backend: str | None = None, astra_sim: str | None = None,
            system: str | None = None, network: str | None = None, topology: str | None = None,
            host: PluginHost | None = None, env: Mapping[str, str] | None = None, validate: bool = True,
            log: bool | None = None, details: bool = False, progress: Progress | None = None) -> Prepared:
    """Everything before the run; raises UsageError (or the set's problems) before writing.

    ``log``: ask for the per-node log (None: when it stays under :data:`LOG_AUTO_LIMIT`).
    ``details``: keep what the nodes of each class's shown rank are (a timeline's args).
    ``progress``: shows reading the set and the run (:class:`stage_core.api.Progress`).
    """
    progress = progress or Progress("off")
    env = os.environ if env is None else env
    host = host or PluginHost()
    traces = open_trace_set(trace_dir)
    chosen = backends.named(backend, astra_sim)
    if topology is not None and chosen is not backends.HTSIM:
        raise UsageError(f"--topology is htsim's fat tree; the {chosen.name} backend takes --network")
    presets = {h.name: h for h in host.hardware()}
    timed_for = traces.manifest.get("hardware")
    timed_hw = None
    asked = system
    if isinstance(timed_for, dict):
        timed_hw = hardware.from_dict(timed_for, f"{traces.root / 'manifest.json'}: hardware")
        presets.setdefault(timed_hw.name, timed_hw)
        system = system or timed_hw.name
    binary = runner.find_binary(chosen, astra_sim, env)  # fail on a bad binary before writing
    log = binary is not None and (traces.log_estimate() <= LOG_AUTO_LIMIT if log is None else log)
    configs = build_configs(traces.world_size, system, network, presets=presets, timed=traces.timed, trace=log)
    if timed_hw is not None and asked is not None and configs.preset is not None \
            and not same_gpu(configs.preset.gpu, timed_hw.gpu):
        raise UsageError(f"--system {asked}: the set was timed for {timed_hw.name} ({hardware.kernel_times(traces.manifest)}"
                         f"), so the simulator would run {configs.preset.name}'s network with {timed_hw.name}'s kernel "
                         f"times; generate the set with --gpu {asked} to time it there, or leave --system out")
    npus = netyml.read_flow_lists(configs.network_text).get("npus_count") or [traces.world_size]
    if chosen.one_dimension and len(npus) > 1:
        raise UsageError(f"the {chosen.name} backend takes a network of one dimension, and world size "
                         f"{traces.world_size} spans {npus[-1]} nodes of {npus[0]} ({configs.network_source}): use "
                         "--backend analytical, or --network FILE with one dimension")
    net_hw = configs.preset or presets.get(configs.network_source.removeprefix("preset "))
    topo_text, notes, topo_source = None, (), None
    if chosen is backends.HTSIM:
        if topology is not None:
            topo_text, topo_source = htsim.read_topology(topology, traces.world_size), f"file {Path(topology).resolve()}"
        else:
            if net_hw is None:
                raise UsageError("htsim's fat tree comes from a hardware preset: give --system PRESET or a hardware "
                                 "file, or --topology FILE.topo")
            tree = htsim.fat_tree(net_hw, traces.world_size)
            topo_text = tree.render(f"htsim fat tree written by stage-adapter-astrasim from preset {net_hw.name}: "
                                    f"{net_hw.description}\nworld size {traces.world_size}\n{htsim.CANNOT_EXPRESS}")
            topo_source = f"preset {net_hw.name}"
            notes = tree.notes + (htsim.CANNOT_EXPRESS,)

    system_json = json.loads(configs.system_text)
    checks = []
    if binary is not None:
        roofline = None
        if system_json.get("roofline-enabled") and isinstance(system_json.get("peak-perf"), (int, float)) \
                and isinstance(system_json.get("local-mem-bw"), (int, float)):
            roofline = (system_json["peak-perf"], system_json["local-mem-bw"])
            checks.append(scan.FirstKernels(traces.manifest.get("rank_classes") or [], *roofline))
        if chosen is backends.HTSIM:
            shape = netmodel.Network(traces.world_size, tuple(netmodel.Dimension(int(n), 1.0, 0.0) for n in npus),
                                     1.0)
            checks.append(scan.HtsimLimits(shape, htsim.MAX_MESSAGE_BYTES, chosen.time_limit_ns,
                                           roofline if not traces.timed else None))
    shown = scan.NodeDetails(timeline.representatives(traces.manifest.get("rank_classes") or [])) \
        if details and log else None
    if shown is not None:
        checks.append(shown)
    scan.scan(host, traces.root, validate=validate, checks=checks, progress=progress)

    work = traces.root / OUT_DIR
    texts = {SYSTEM_FILE: configs.system_text, NETWORK_FILE: configs.network_text, MEMORY_FILE: configs.memory_text}
    if log:
        texts[timeline.LOGGING_FILE] = timeline.logging_config(work / timeline.LOG_FILE)
    if topo_text is not None:
        texts[htsim.TOPOLOGY_FILE] = topo_text
    files.write_folder(work, texts)
    paths = runner.SimPaths(workload=traces.workload_prefix, comm_groups=traces.comm_groups,
                            system=work / SYSTEM_FILE, network=work / NETWORK_FILE, memory=work / MEMORY_FILE,
                            logging=work / timeline.LOGGING_FILE if log else None,
                            topology=work / htsim.TOPOLOGY_FILE if topo_text is not None else None)
    meta = {"trace_dir": str(traces.root), "backend": chosen.name, "system": configs.system_source,
            "network": configs.network_source, **kernel_timing(traces.manifest, system_json, configs)}
    if topo_source:
        meta["topology"] = topo_source
    return Prepared(traces, chosen, binary, configs, work, paths, meta, log, validate, tuple(notes),
                    shown.of if shown is not None else {}, progress)


def _tail(path: Path, limit: int = 4000) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - limit))
        return handle.read().decode(errors="replace")


def run(prep: Prepared) -> SimRun:
    """Run the simulator on a prepared set; results.json is written whatever the outcome."""
    if prep.binary is None:
        raise UsageError(f"no ASTRA-sim {prep.backend.name} binary: {why_unavailable(prep.backend, {})}")
    traces, work = prep.traces, prep.work
    progress = prep.progress or Progress("off")
    with progress.phase(f"simulating ({prep.backend.name})", traces.world_size, "ranks finished") as finished:
        done = runner.run(prep.binary, prep.paths, work, scratch=prep.backend is backends.HTSIM, progress=finished)
    markers = parser.Markers()
    with open(done.stdout_path, errors="replace") as handle:
        ranks = parser.parse_lines(handle, markers)
    stderr = _tail(done.stderr_path)
    world = traces.world_size
    verdict = outcome.classify(
        done.returncode, parser.unfinished_ranks(ranks, world), world, markers, backend=prep.backend.name,
        validated=prep.validated, stops_at_ns=prep.backend.stops_at_ns, stderr_tail=stderr,
        explanation=htsim.explain(stderr) if prep.backend is backends.HTSIM else None,
        logs=f"{done.stderr_path} and {done.stdout_path}")
    meta = {**prep.meta, "astra_sim": str(prep.binary), "returncode": done.returncode}
    results = report.build_results(ranks, world, meta, verdict)
    classes = traces.manifest.get("rank_classes", [])
    shown: dict[int, list[timeline.Span]] = {}
    if prep.log and classes and (work / timeline.LOG_FILE).is_file():
        with open(work / timeline.LOG_FILE, errors="replace") as handle:
            shown = timeline.read_log(handle, set(timeline.representatives(classes)))
    peak = prep.configs.preset.gpu.peak_flops("bf16") if prep.configs.preset else None
    rows = steptime.class_results(traces.manifest, ranks, shown, peak)
    job = steptime.job_results(traces.manifest, results["summary"]["max_finish_time_ns"], peak)
    if rows:
        results["rank_classes"] = rows
        results["summary"].update(job)
    served = serving.serving_results(traces.manifest, ranks)
    if served is not None:
        results["serving"] = served
    files.write_file(work / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    return SimRun(prep, done.returncode, ranks, verdict, results, rows, job, shown)


def simulate_set(trace_dir: str | Path, **options) -> SimRun:
    """:func:`prepare` and :func:`run`; UsageError when no binary is found."""
    return run(prepare(trace_dir, **options))


# --------------------------------------------------------------------------- the stage_simulators records


def why_unavailable(backend: Backend, env: Mapping[str, str] | None = None) -> str | None:
    """None when ``backend``'s binary is found (its variable, else on PATH), else why not."""
    try:
        binary = runner.find_binary(backend, None, os.environ if env is None else env)
    except UsageError as exc:
        return str(exc)
    if binary is None:
        return (f"no ASTRA-sim {backend.name} binary: set ${backend.env_var} or put {backend.path_names[0]} on PATH "
                f"(…/{backend.build_path} in an astra-sim build)")
    return None


def simulate_record(backend: Backend, directory: Path, hw: HardwareSpec | None = None,
                    host: PluginHost | None = None) -> dict:
    """A ``stage_simulators`` record's ``simulate``: run the set in ``directory`` on ``hw``
    (None: the hardware it was timed for); ``{"step_time_s", "finished", "outcome", "results"}``."""
    reason = why_unavailable(backend)
    if reason:
        raise UsageError(reason)
    host = host or PluginHost()
    system = None
    if hw is not None:
        system = hw.name if hw in host.hardware() else None
        if system is None:  # read into the configs before the folder is replaced
            saved = Path(directory) / OUT_DIR / "hardware.json"
            hardware.save(hw, saved, "--system", within_set=True, force=True)
            system = str(saved)
    done = simulate_set(directory, backend=backend.name, system=system, host=host, validate=False, log=False)
    return {"step_time_s": done.step_time_s, "finished": done.finished, "outcome": done.outcome.status,
            "results": done.results}
