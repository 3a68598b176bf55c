"""Where a trace set goes: ``-o`` checked, the set written beside it, then moved into place.

STAGE never destroys what it did not write.  An output folder is replaced only when
it is empty or holds a STAGE trace set and nothing else: a ``manifest.json`` of STAGE's
(``stage_version`` and ``world_size``), ``comm_groups.json`` and
``trace.<rank>.<suffix>`` files for ranks below that world size, all regular files.
Anything else is refused before any work, in one line that lists what else is there.

The set is written into a temporary folder beside the target (``.<name>.tmp-XXXXXXXX``,
short enough for any file-name limit), then renamed into place with signals blocked,
so the target is always either the previous set or the complete new one.  A failure,
Ctrl-C, SIGTERM or SIGHUP (see :func:`stage_core.cli.main`) removes the temporary
folder and any parent folder this run created.  The folder comes out with the mode
the umask gives, like any folder ``mkdir`` makes.

    target = check_target("traces")
    with staging(target) as tmp:
        backend.write(job, tmp)     # an OSError here becomes an OutputError
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import OutputError, UsageError

MANIFEST = "manifest.json"
COMM_GROUPS = "comm_groups.json"
_TRACE_FILE = re.compile(r"^trace\.(0|[1-9][0-9]*)\.[A-Za-z0-9]+$")
#: bytes of the target's name kept in the temporary names (".<name>.tmp-" + 8 random)
_NAME_BYTES = 40
#: the longest file name a set puts in its folder ("trace.<rank>.<suffix>" and the
#: JSON files), with room for ranks up to 10**12
_LONGEST_INSIDE = len("trace.999999999999.jsonl")
#: a manifest larger than this is not read to recognize a set
_MANIFEST_LIMIT = 1 << 28
_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s)


def _flag(out: str | os.PathLike) -> str:
    return f"-o {os.fspath(out) or repr('')}"


def check_target(out: str | os.PathLike) -> Path:
    """The folder ``-o out`` names, absolute, after checking that a set may go there.

    A symbolic link to a folder stands for that folder.  Raises :class:`UsageError`
    (one line naming ``out``) for an empty name, the folder you are in or one that
    holds it, a dangling link, a file, a name too long for the file system, a folder
    that cannot be written, and a folder that holds anything but a STAGE trace set.
    """
    text = os.fspath(out)
    flag = _flag(out)
    if not text.strip():
        raise UsageError(f"{flag}: empty folder name; give one, e.g. -o traces")
    name_max = _limit(Path.cwd(), "PC_NAME_MAX", 255)
    for part in Path(text).parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise UsageError(f"{flag}: the name {part[:24]}... is {size} bytes long; "
                             f"this file system allows at most {name_max}")
    try:
        return _check_target(text, flag)
    except OSError as exc:  # a component that cannot be searched, a name too long...
        raise UsageError(f"{flag}: {exc.strerror or exc}") from None
    except RuntimeError:  # pathlib's resolve() on a loop of links
        raise UsageError(f"{flag}: is a loop of symbolic links; give a folder") from None


def _check_target(text: str, flag: str) -> Path:
    path = Path(text)
    link = path if path.is_symlink() else None
    target = path.resolve()  # absolute, '..' and links resolved; the tail may not exist
    if link is not None and not target.exists():
        raise UsageError(f"{flag}: is a symbolic link to {os.readlink(link)}, which does not exist; "
                         f"give a folder, or create the link's target first")
    if target.parent == target:
        raise UsageError(f"{flag}: is the root folder; give a folder to write the set into, e.g. -o traces")
    here = Path.cwd().resolve()
    if target == here or target in here.parents:
        what = "is the folder you are in" if target == here else f"holds the folder you are in ({here})"
        raise UsageError(f"{flag}: {what}; STAGE replaces its output folder as a whole, "
                         f"so give a folder inside it, e.g. -o {Path(text) / 'traces'}")
    if target.exists() and not target.is_dir():
        raise UsageError(f"{flag}: exists and is not a folder")
    probe = target.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{flag}: {probe} is not a folder")
    path_max = _limit(probe, "PC_PATH_MAX", 4096)
    if len(os.fsencode(str(target))) + 1 + _LONGEST_INSIDE >= path_max:
        raise UsageError(f"{flag}: the path is too long for the files of a set "
                         f"(this file system allows {path_max} bytes per path)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: cannot write in {probe} (permission denied)")
    if target.is_dir():
        _check_replaceable(target, flag)
    return target


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def _check_replaceable(folder: Path, flag: str) -> None:
    """Raise UsageError unless ``folder`` is empty or holds a STAGE trace set only."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read the folder ({exc.strerror})") from None
    if not entries:
        return
    world = stage_manifest_world(folder / MANIFEST)
    if world is None:
        raise UsageError(f"{flag}: exists and is not a STAGE trace set (no manifest.json of STAGE's); "
                         f"it holds {_listing(folder, entries)}; give a new or empty folder")
    foreign = [e for e in entries if not _is_set_file(folder / e, world)]
    if foreign:
        raise UsageError(f"{flag}: holds files STAGE did not write ({_listing(folder, foreign)}); STAGE "
                         f"replaces its output folder as a whole: move them away or give another folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: cannot replace the set in it (permission denied)")


def stage_manifest_world(path: Path) -> int | None:
    """The world size of a STAGE manifest at ``path``; None if it is not one."""
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > _MANIFEST_LIMIT:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("stage_version"), str):
        return None
    world = data.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        return None
    return world


def _is_set_file(path: Path, world: int) -> bool:
    name = path.name
    if name not in (MANIFEST, COMM_GROUPS):
        m = _TRACE_FILE.match(name)
        if m is None or int(m[1]) >= world:
            return False
    return path.is_file() and not path.is_symlink()


def _listing(folder: Path, names: list[str], shown: int = 6) -> str:
    marked = [n + "/" if (folder / n).is_dir() and not (folder / n).is_symlink() else n for n in names[:shown]]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(marked) + more


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends (a rename pair or a
    cleanup is not cut in half); they are delivered right after."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _temp_prefix(target: Path, kind: str) -> str:
    short = os.fsencode(target.name)[:_NAME_BYTES].decode(errors="ignore")
    return f".{short}.{kind}-"


@contextmanager
def staging(target: Path, label: str | None = None) -> Iterator[Path]:
    """A temporary folder beside ``target``; moved into place when the block succeeds.

    ``target`` comes from :func:`check_target`; it is checked again just before the
    move, in case files appeared in it meanwhile.  An ``OSError`` of the block (a full
    disk, an I/O error) becomes an :class:`OutputError` naming the file; whatever the
    block raises, the temporary folder and the parent folders made for it are
    removed and ``target`` is left as it was.  ``label`` starts the messages (default
    ``-o <target>``).
    """
    label = label or _flag(target)
    parent = target.parent
    created = [p for p in [parent, *parent.parents] if not p.exists()]
    tmp = None
    try:
        try:
            parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(target, "tmp"), dir=parent))
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        except OSError as exc:
            raise _output_error(label, exc, f"cannot create a folder in {parent}") from None
        try:
            yield tmp
        except OSError as exc:
            raise _output_error(label, exc, "cannot write the set") from None
        if target.is_dir() or target.is_symlink():
            _check_replaceable(target, label)
        try:
            _move_into_place(tmp, target)
        except OSError as exc:
            raise _output_error(label, exc, "cannot move the set into place") from None
        tmp = None
    except BaseException:
        with _signals_blocked():
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for folder in created:  # deepest first: folders this run made for nothing
                try:
                    folder.rmdir()
                except OSError:
                    break
        raise


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; a previous set there is removed once it is replaced."""
    with _signals_blocked():
        if not target.exists():
            os.rename(tmp, target)
            return
        old = Path(tempfile.mkdtemp(prefix=_temp_prefix(target, "old"), dir=target.parent))
        try:
            os.rename(target, old / "set")
        except OSError:
            os.rmdir(old)
            raise
        try:
            os.rename(tmp, target)
        except OSError:
            os.rename(old / "set", target)  # the previous set back where it was
            os.rmdir(old)
            raise
        shutil.rmtree(old, ignore_errors=True)


def _output_error(label: str, exc: OSError, what: str) -> UsageError | OutputError:
    """One line for an OSError while writing: a permission problem is the user's to
    fix (UsageError), anything else (a full disk) an OutputError."""
    where = f" ({exc.filename})" if exc.filename else ""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return UsageError(f"{label}: {what}{where}: {reason}")
    fix = "; free some space or give another folder" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return OutputError(f"{label}: {what}{where}: {reason}; nothing was changed{fix}")

