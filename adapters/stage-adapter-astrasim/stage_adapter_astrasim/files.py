"""Atomic writes: a folder through a temp folder and a rename, a file through a temp file."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from stage_core.api import UsageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_folder(target: Path, files: dict[str, str]) -> None:
    """Replace folder ``target`` by one holding exactly ``files`` ({name: text}).

    The files are written into a temp folder next to ``target`` which is then renamed
    into place, so ``target`` is either the old folder or the complete new one.
    """
    parent = target.parent
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    except OSError as exc:
        raise UsageError(f"cannot write into {parent}: {exc.strerror}") from None
    old = None
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        for name, text in files.items():
            (tmp / name).write_text(text)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=parent))
            os.rmdir(old)
            os.rename(target, old)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not target.exists():
            os.rename(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
