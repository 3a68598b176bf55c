"""Units of work named by their content, and a folder of their finished results.

A *unit* is plain data saying everything its result depends on (a sweep point's flags,
its hardware, what it measures, the versions of the installed STAGE distributions).
Its id is the SHA-256 of its canonical JSON, so the same unit under the same code is
never evaluated twice, whichever executor ran it and wherever.  ``stage sweep`` keeps
one JSON file per finished unit, ``stage dataset`` one ``.npz`` of its graphs; both
through :class:`UnitCache`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from .errors import UsageError

T = TypeVar("T")


def unit_id(unit: Any) -> str:
    """SHA-256 (hex) of ``unit``'s canonical JSON (keys sorted, no spaces)."""
    text = json.dumps(unit, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def code_versions(host) -> dict[str, str]:
    """The versions a unit's result depends on: the core's and every installed plugin's."""
    from . import __version__

    out = {"stage-core": __version__}
    for info in host.info():
        if info.version:
            out[info.name] = info.version
    return out


class UnitCache:
    """A folder of finished units' results, one file per unit: ``<id><suffix>``.

    Reads never fail: an absent or damaged file is a unit to evaluate again.  Writes go
    through a temporary file renamed into place, so a reader (or a run killed half-way)
    never sees half a result.
    """

    def __init__(self, folder: str | os.PathLike, flag: str = "--cache"):
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{flag} {folder}: cannot create it ({exc.strerror})") from None

    def path(self, uid: str, suffix: str = ".json") -> Path:
        return self.folder / f"{uid}{suffix}"

    def read(self, uid: str, suffix: str, reader: Callable[[Path], T]) -> T | None:
        """``reader(path)`` of the unit's file, or None when it is absent or ``reader`` fails on it
        (whatever it raises: a damaged file of any format is a unit to evaluate again)."""
        path = self.path(uid, suffix)
        if not path.is_file():
            return None
        try:
            return reader(path)
        except Exception:
            return None

    def write(self, uid: str, suffix: str, writer: Callable[[Any], None]) -> Path:
        """``writer(file)`` writes the unit's result to an open binary file; renamed into place."""
        path = self.path(uid, suffix)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                writer(f)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def read_json(self, uid: str) -> Any | None:
        return self.read(uid, ".json", lambda p: json.loads(p.read_text()))

    def write_json(self, uid: str, data: Any) -> Path:
        return self.write(uid, ".json", lambda f: f.write((json.dumps(data, sort_keys=True) + "\n").encode()))
