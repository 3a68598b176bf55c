"""The presets ``stage models`` lists, with their parameter counts, kept between runs.

A preset's parameter count comes from its model graph (:func:`stage_core.models.param_counts`),
and building the graphs of every installed preset takes seconds (some 70 of them, 2 to 5 s
on two cores).  So each count is kept in a small file of the user's cache folder, named
by what it depends on: the preset's config, its plugin and that plugin's version, the
core's version, and the size and time of every source file of the plugin's package and
of the core (an edited plugin in an editable install counts again).  ``stage models``
then builds only what it has not counted before.

The folder is ``$STAGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/stage``, else
``~/.cache/stage``; ``STAGE_CACHE_DIR=off`` keeps nothing.  A folder that cannot be
written only costs the time of counting again; a damaged file is counted again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from . import __version__
from .errors import StageError

CACHE_FILE = "preset-params.json"
#: counts kept at most (those of the presets installed now, when there are more)
MAX_KEPT = 4096


def cache_folder() -> Path | None:
    """Where counts are kept (None: nowhere)."""
    given = os.environ.get("STAGE_CACHE_DIR")
    if given is not None:
        return None if given.strip().lower() in ("", "off", "none", "0") else Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stage"


def _package_folder(fn: Callable) -> Path | None:
    fn = getattr(fn, "__wrapped__", fn)
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not path:
        return None
    top = (getattr(module, "__package__", None) or module.__name__).split(".")[0]
    top_module = sys.modules.get(top)
    return Path(getattr(top_module, "__file__", path)).parent


def _fingerprint(folder: Path | None, memo: dict) -> str:
    """Names, sizes and modification times of the Python files under ``folder``."""
    if folder is None:
        return ""
    got = memo.get(folder)
    if got is None:
        h = hashlib.sha256()
        for path in sorted(folder.rglob("*.py")):
            try:
                info = path.stat()
            except OSError:
                continue
            h.update(f"{path.relative_to(folder)}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
        got = memo[folder] = h.hexdigest()
    return got


def preset_key(spec, name: str, config, versions: dict[str, str], memo: dict) -> str:
    """What a preset's count depends on, hashed."""
    core = Path(__file__).parent
    data = {"core": __version__, "core_files": _fingerprint(core, memo), "plugin": spec.plugin,
            "version": versions.get(spec.plugin, ""), "family": spec.family, "name": name,
            "files": _fingerprint(_package_folder(spec.build), memo),
            "config": json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _read(path: Path) -> dict[str, list[int]]:
    try:
        data = json.loads(path.read_text())
        counts = data.get("counts") if isinstance(data, dict) else None
        return {k: v for k, v in counts.items() if isinstance(v, list) and len(v) == 2
                and all(type(x) is int for x in v)} if isinstance(counts, dict) else {}
    except (OSError, ValueError, RecursionError, AttributeError):
        return {}


def _write(path: Path, counts: dict[str, list[int]]) -> None:
    from .output import stage_mark, write_output

    try:
        write_output(path, json.dumps({**stage_mark(), "counts": counts}, sort_keys=False) + "\n", "cache",
                     force=True)
    except (StageError, OSError):
        pass  # (a folder that cannot be written: counted again next time)


def preset_rows(host, count: Callable[[Any, Any], tuple[int, int]], progress=None) -> list[dict]:
    """One row per installed preset (name, family, plugin, params_total, params_active), the
    counts read from the cache or ``count(spec, config)`` for those not counted before."""
    from .progress import Progress

    progress = progress or Progress("off")
    versions = {info.name: info.version or "" for info in host.info()}
    folder = cache_folder()
    path = folder / CACHE_FILE if folder is not None else None
    kept = _read(path) if path is not None else {}
    memo: dict = {}
    wanted = [(spec, name, spec.presets[name]) for spec in host.models() for name in sorted(spec.presets)]
    keys = [preset_key(spec, name, config, versions, memo) for spec, name, config in wanted]
    todo = [i for i, k in enumerate(keys) if k not in kept]
    fresh: dict[str, list[int]] = {}
    for i in progress.iterate(todo, "counting parameters", "presets"):
        spec, _, config = wanted[i]
        fresh[keys[i]] = list(count(spec, config))
    if fresh and path is not None:
        merged = {**kept, **fresh}  # (other environments' counts kept too, up to a bound)
        if len(merged) > MAX_KEPT:
            live = set(keys)
            merged = {k: v for k, v in merged.items() if k in live}
        _write(path, merged)
    rows = []
    for (spec, name, _), key in zip(wanted, keys):
        total, active = fresh.get(key) or kept[key]
        rows.append({"name": name, "family": spec.family, "plugin": spec.plugin,
                     "params_total": total, "params_active": active})
    return rows
