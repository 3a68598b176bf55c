"""Checks that a directory is a STAGE trace set ASTRA-sim can run, and reads its size."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stage_core.api import MAX_WORLD, UsageError, read_json

TRACE_PREFIX = "trace"
COMM_GROUPS = "comm_groups.json"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class TraceSet:
    """The paths of a trace set and its world size."""

    root: Path
    world_size: int
    manifest: dict[str, Any] = field(default_factory=dict)

    def log_estimate(self) -> int:
        """Bytes the simulator's per-node log of this set would take (about
        :data:`.timeline.LOG_BYTES_PER_NODE` per node of every rank; a trace file
        holds some 60 bytes per node)."""
        from .timeline import LOG_BYTES_PER_NODE

        trace_bytes = sum(p.stat().st_size for p in self.root.glob(f"{TRACE_PREFIX}.*.et"))
        return trace_bytes // 60 * LOG_BYTES_PER_NODE

    @property
    def timed(self) -> bool:
        """Whether ``stage generate --gpu`` wrote each compute node's duration."""
        return bool(self.manifest.get("compute_model"))

    @property
    def workload_prefix(self) -> Path:
        """What ``--workload-configuration`` takes: files are ``<prefix>.<rank>.et``."""
        return self.root / TRACE_PREFIX

    @property
    def comm_groups(self) -> Path:
        return self.root / COMM_GROUPS


def open_trace_set(directory: str | Path) -> TraceSet:
    """Resolve ``directory`` and check manifest, comm groups and one trace per rank."""
    root = Path(directory).expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"trace directory {directory} does not exist: give a folder "
                         "written by `stage generate`")
    manifest_path = root / MANIFEST
    if not manifest_path.exists():  # (a FIFO or a folder there: read_json says which)
        raise UsageError(f"{manifest_path} is missing: {directory} is not a STAGE trace set")
    manifest = read_json(manifest_path, str(manifest_path))  # (regular, bounded in size and depth)
    world = manifest.get("world_size") if isinstance(manifest, dict) else None
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise UsageError(f"{manifest_path}: world_size {world!r} is not a positive integer")
    if world > MAX_WORLD:  # (before looking for one file per rank)
        raise UsageError(f"{manifest_path}: world_size {world:,} is above the {MAX_WORLD:,} ranks STAGE writes")
    if not (root / COMM_GROUPS).is_file():
        raise UsageError(f"{root / COMM_GROUPS} is missing: ASTRA-sim needs the "
                         "process groups the traces name")
    missing = [r for r in range(world) if not (root / f"{TRACE_PREFIX}.{r}.et").is_file()]
    if missing:
        shown = ", ".join(f"{TRACE_PREFIX}.{r}.et" for r in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise UsageError(f"{root}: {shown}{more} missing for world_size {world}")
    return TraceSet(root=root, world_size=world, manifest=manifest)
