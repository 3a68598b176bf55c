"""Where a trace set goes: ``-o`` checked, the set written beside it, then moved into place.

STAGE never destroys what it did not write.  An output folder is replaced only when
it is empty or holds a STAGE trace set and nothing else: a ``manifest.json`` of STAGE's
(``stage_version`` and ``world_size``), ``comm_groups.json`` and
``trace.<rank>.<suffix>`` files for ranks below that world size, all regular files,
and what STAGE wrote in the set afterwards: a folder it wrote there (``stage astrasim``'s
``astrasim/``: :func:`write_output_folder` marks each folder it writes with
:data:`FOLDER_MARK`, and what a simulator adds to such a folder goes with it) and files
it recognizes as its own (:func:`recognized`: a timeline, a plot).  Anything else is
refused before any work, in one line that lists what else is there.

The set is written into a temporary folder beside the target (``.<name>.tmp-XXXXXXXX``,
short enough for any file-name limit), then renamed into place with signals blocked,
so the target is always either the previous set or the complete new one.  A failure,
Ctrl-C, SIGTERM or SIGHUP (see :func:`stage_core.cli.main`) removes the temporary
folder and any parent folder this run created.  The folder comes out with the mode
the umask gives, like any folder ``mkdir`` makes.

    target = check_target("traces")
    with staging(target) as tmp:
        backend.write(job, tmp)     # an OSError here becomes an OutputError

Every other file STAGE writes (a sweep's table, a timeline, a plot, a calibrated
hardware file, ASTRA-sim's configs) goes through :func:`write_output`, one rule for
all: the file is written beside its target under a temporary name and renamed into
place; a symbolic link, a folder, a device, a FIFO or a socket is never replaced, nor
a file inside a trace set, nor an input of the same command; an existing regular file
only when STAGE wrote it (:func:`recognized`: the mark STAGE puts in each format) or
with ``--force``.

Crash-only cleanup: every temporary name carries its writer's pid (and a tag of its
host), ``.<name>.tmp-<pid>-<host>-XXXXXXXX``.  A SIGKILL leaves one behind; the next
write into the same target removes those whose writer is gone (:func:`remove_stale`),
and puts back a previous set a kill left half-replaced.  :func:`die_with_parent` makes
a worker process end with the process that started it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

from . import __version__
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
#: the key STAGE puts first in every JSON document it writes (beside a trace set's
#: manifest, which has its own): what :func:`recognized` looks for
STAGE_MARK = "stage_version"
#: bytes read from the start of a file to recognize it as STAGE's
_HEAD_BYTES = 1 << 16
#: the file :func:`write_output_folder` puts in every folder it writes: the folder is STAGE's
FOLDER_MARK = ".stage-folder.json"


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
    foreign = [e for e in entries if not _is_set_file(folder / e, world) and not stage_output(folder / e)]
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


def stage_output(path: Path) -> bool:
    """Whether ``path``, inside a trace set, is something STAGE wrote there after the set: a
    folder :func:`write_output_folder` marked (whatever a simulator added to it), or a regular
    file STAGE :func:`recognized` (a timeline, a plot).  Never a link."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISDIR(info.st_mode):
        mark = path / FOLDER_MARK
        return mark.is_file() and not mark.is_symlink() and recognized(mark)
    return stat.S_ISREG(info.st_mode) and recognized(path)


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


def _short(target: Path) -> str:
    return os.fsencode(target.name)[:_NAME_BYTES].decode(errors="ignore")


def _host_tag() -> str:
    """Four hex digits of this host's name: a temporary name of another host (a shared
    network folder) is never taken for one whose writer is gone."""
    return f"{zlib.crc32(socket.gethostname().encode()) & 0xFFFF:04x}"


def _temp_prefix(target: Path, kind: str) -> str:
    """``.<name>.<kind>-<pid>-<host>-`` (mkdtemp and mkstemp add 8 random characters)."""
    return f".{_short(target)}.{kind}-{os.getpid()}-{_host_tag()}-"


_TEMP_NAME = re.compile(r"^\.(?P<name>.*)\.(?P<kind>tmp|old)-(?P<pid>[0-9]{1,10})-(?P<host>[0-9a-f]{4})-[^/]{8}")


def remove_stale(target: Path) -> list[str]:
    """Remove the temporary files and folders beside ``target`` that a writer of it left
    when it was killed (SIGKILL, a power cut): those whose writer is gone (see
    :func:`writer_gone`).  A previous set that a kill left moved aside (target
    missing) is put back first.  Returns the names removed; errors are ignored (the
    next run tries again)."""
    parent, short, host = target.parent, _short(target), _host_tag()
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in sorted(entries, key=lambda e: e.name):
        m = _TEMP_NAME.match(entry.name)
        if m is None or m["name"] != short or m["host"] != host:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not writer_gone(int(m["pid"]), info.st_mtime):
            continue
        with _signals_blocked():
            path = Path(entry.path)
            if m["kind"] == "old" and (path / "set").is_dir() and not os.path.lexists(target):
                try:
                    os.rename(path / "set", target)  # the previous set, back where it was
                except OSError:
                    pass
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    path.unlink()
                except OSError:
                    continue
        removed.append(entry.name)
    return removed


def writer_gone(pid: int, since: float) -> bool:
    """Whether process ``pid``, which last touched a temporary name at ``since`` (epoch
    seconds), is gone: no such process, or one that started after that (the pid was
    given to another program).  A process of another user counts as alive."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # another user's process
    except (ProcessLookupError, OverflowError):  # (no such pid, or none that large)
        return True
    started = _start_time(pid)
    return started is not None and started > since + 2  # (boot time has whole seconds)


def _start_time(pid: int) -> float | None:
    """When process ``pid`` started, in epoch seconds (Linux's /proc); None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rpartition(b")")[2].split()
        ticks = int(fields[19])  # field 22, starttime, counted after the command name
        with open("/proc/stat", "rb") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith(b"btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def die_with_parent() -> None:
    """Make this process (a worker) end when the process that started it does.

    For a pool's ``initializer``.  On Linux the kernel sends SIGKILL when the parent
    dies (``prctl(PR_SET_PDEATHSIG)``); elsewhere a thread checks the parent every
    second.  Either way a worker never goes on writing after its parent was killed.
    """
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
                if os.getppid() != parent:  # the parent died before the request
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


@contextmanager
def staging(target: Path, label: str | None = None,
            replaceable: Callable[[Path, str], None] | None = None, what: str = "the set") -> Iterator[Path]:
    """A temporary folder beside ``target``; moved into place when the block succeeds.

    ``target`` comes from :func:`check_target`; it is checked again just before the
    move, in case files appeared in it meanwhile.  An ``OSError`` of the block (a full
    disk, an I/O error) becomes an :class:`OutputError` naming the file; whatever the
    block raises, the temporary folder and the parent folders made for it are
    removed and ``target`` is left as it was.  ``label`` starts the messages (default
    ``-o <target>``).  ``replaceable(folder, label)`` raises UsageError unless an
    existing ``target`` may be replaced (default: empty, or a STAGE trace set only).
    Temporary names left by a killed writer of ``target`` are removed first.
    """
    label = label or _flag(target)
    check = replaceable or _check_replaceable
    parent = target.parent
    created = [p for p in [parent, *parent.parents] if not p.exists()]
    remove_stale(target)
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
            raise _output_error(label, exc, f"cannot write {what}") from None
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise UsageError(f"{label}: something that is not a folder appeared there meanwhile; nothing was changed")
        if target.is_dir():
            check(target, label)
        try:
            _move_into_place(tmp, target)
        except OSError as exc:
            raise _output_error(label, exc, f"cannot move {what} into place") from None
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



# --------------------------------------------------------------------------- single files


#: what a non-regular file is called in messages
_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def check_output_file(path: str | os.PathLike, flag: str = "-o", *, inputs: Iterable[str | os.PathLike] = (),
                      force: bool = False, ours: Callable[[Path], bool] | None = None,
                      within_set: bool = False) -> Path:
    """The file ``flag path`` names, absolute, after checking that STAGE may write it.

    Refused, in one line naming ``path`` (:class:`UsageError`): an empty or too long
    name; a symbolic link, a folder, a device, a FIFO or a socket (never replaced,
    even with ``force``); a file inside a trace set (unless ``within_set``: a file the
    set's own tools keep there); one of ``inputs`` (the files and folders the command
    reads) or a file inside one of them; an existing regular file that STAGE did not
    write (``ours(path)``, default :func:`recognized`), unless ``force``; a folder
    that cannot be written.
    """
    text = os.fspath(path)
    label = f"{flag} {text or repr('')}"
    if not text.strip():
        raise UsageError(f"{label}: empty file name; give one")
    name_max = _limit(Path.cwd(), "PC_NAME_MAX", 255)
    for part in Path(text).parts:
        if len(os.fsencode(part)) > name_max:
            raise UsageError(f"{label}: the name {part[:24]}... is {len(os.fsencode(part))} bytes long; "
                             f"this file system allows at most {name_max}")
    if text.endswith(os.sep) or Path(text).name in ("", ".", ".."):
        raise UsageError(f"{label}: is a folder name; give a file name")
    try:
        return _check_output_file(Path(text), label, [Path(i) for i in inputs], force, ours or recognized,
                                  within_set)
    except OSError as exc:
        raise UsageError(f"{label}: {exc.strerror or exc}") from None
    except RuntimeError:  # pathlib's resolve() on a loop of links
        raise UsageError(f"{label}: its folder is a loop of symbolic links") from None


def _check_output_file(path: Path, label: str, inputs: list[Path], force: bool, ours: Callable[[Path], bool],
                       within_set: bool) -> Path:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except NotADirectoryError:
        raise UsageError(f"{label}: a part of the path is a file, not a folder") from None
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            raise UsageError(f"{label}: is a symbolic link (to {os.readlink(path)}); STAGE does not replace "
                             f"links: give the file itself, or another name")
        if not stat.S_ISREG(info.st_mode):
            kind = next((k for test, k in _KINDS if test(info.st_mode)), "not a regular file")
            raise UsageError(f"{label}: is {kind}; STAGE writes regular files only: give another name")
    target = path.parent.resolve() / path.name
    for source in inputs:
        if not os.path.lexists(source):
            continue
        whole = source.resolve()
        if target == whole or (info is not None and _same_file(target, source)):
            raise UsageError(f"{label}: is {source}, which this command reads; write to another file")
        if whole.is_dir() and whole in target.parents:
            raise UsageError(f"{label}: is inside {source}, which this command reads; write outside it")
    if not within_set:
        holder = trace_set_holding(target)
        if holder is not None:
            raise UsageError(f"{label}: is inside the trace set {holder}; STAGE writes no file into a set: "
                             f"give a path outside it")
    probe = target.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{label}: {probe} is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{label}: cannot write in {probe} (permission denied)")
    if info is not None and not force and not ours(target):
        raise UsageError(f"{label}: exists and STAGE did not write it; give another name, or --force to "
                         f"replace it")
    return target


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def trace_set_holding(path: Path) -> Path | None:
    """The trace set folder ``path`` lies in, if any: a folder above it holding a STAGE
    manifest, or ``path``'s own folder holding a ``comm_groups.json`` (any generator's set)."""
    folder = path.parent
    if (folder / COMM_GROUPS).is_file():
        return folder
    for above in [folder, *folder.parents]:
        if (above / MANIFEST).is_file() and stage_manifest_world(above / MANIFEST) is not None:
            return above
    return None


def write_output(path: str | os.PathLike, content: str | bytes | Callable[[Path], None], flag: str = "-o", *,
                 inputs: Iterable[str | os.PathLike] = (), force: bool = False,
                 ours: Callable[[Path], bool] | None = None, within_set: bool = False) -> Path:
    """Write one file by STAGE's output rule; returns where it went (absolute).

    ``content`` is the text or bytes of the file, or a function that writes it into
    the path it is given (``lambda tmp: fig.savefig(tmp, format="png")``; the path
    ends with the target's suffix).  The target is checked by
    :func:`check_output_file` (same arguments), the file written beside it under a
    temporary name (``.<name>.tmp-<pid>-<host>-XXXXXXXX<suffix>``), checked again, and
    renamed into place with signals held: the target is the previous file or the
    whole new one.  Any failure removes the temporary file and the parent folders
    made for it; an ``OSError`` is one line (:class:`OutputError`, or
    :class:`UsageError` for a permission problem).  Temporary names a killed writer
    of the same target left are removed first.
    """
    inputs = list(inputs)
    options = dict(inputs=inputs, force=force, ours=ours, within_set=within_set)
    target = check_output_file(path, flag, **options)
    label = f"{flag} {os.fspath(path)}"
    parent = target.parent
    created = [p for p in [parent, *parent.parents] if not p.exists()]
    remove_stale(target)
    tmp = None
    try:
        try:
            parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=_temp_prefix(target, "tmp"), suffix=target.suffix, dir=parent)
            tmp = Path(name)
            if callable(content):
                os.close(fd)
                content(tmp)
            else:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(content.encode() if isinstance(content, str) else content)
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
        except OSError as exc:
            raise _output_error(label, exc, "cannot write the file") from None
        with _signals_blocked():
            check_output_file(path, flag, **{**options, "force": True})  # nothing else appeared meanwhile
            try:
                os.replace(tmp, target)
            except OSError as exc:
                raise _output_error(label, exc, "cannot move the file into place") from None
            tmp = None
    except BaseException:
        with _signals_blocked():
            if tmp is not None:
                try:
                    tmp.unlink()
                except OSError:
                    pass
            for folder in created:
                try:
                    folder.rmdir()
                except OSError:
                    break
        raise
    return target


def write_output_folder(target: str | os.PathLike, files: Mapping[str, str | bytes], flag: str, *,
                        replaceable: Callable[[Path], bool]) -> Path:
    """Replace the folder ``target`` by one holding exactly ``files`` ({name: content}) and
    :data:`FOLDER_MARK` (the folder is STAGE's: ``-o`` replaces a set with it), through a
    temporary folder beside it (see :func:`staging`).  An existing folder is replaced only
    when ``replaceable(folder)`` says it is STAGE's; a link or anything but a folder never is."""
    text = os.fspath(target)
    label = f"{flag} {text}"
    path = Path(text)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise UsageError(f"{label}: exists and is not a folder; STAGE replaces only a folder it wrote")

    def check(folder: Path, where: str) -> None:
        if os.listdir(folder) and not replaceable(folder):
            raise UsageError(f"{where}: holds files STAGE did not write "
                             f"({_listing(folder, sorted(os.listdir(folder)))}); move them away")

    whole = path.parent.resolve() / path.name
    if whole.is_dir():
        check(whole, label)
    with staging(whole, label, check, "the folder") as tmp:
        for name, content in files.items():
            (tmp / name).write_bytes(content.encode() if isinstance(content, str) else content)
        (tmp / FOLDER_MARK).write_text(json.dumps({**stage_mark(), "written_by": flag}) + "\n")
    return whole


@contextmanager
def scratch_folder(label: str) -> Iterator[Path]:
    """A folder of this process's own in the system's temporary folder
    (``.stage-<label>.tmp-<pid>-<host>-XXXXXXXX``), removed with what it holds when the
    block ends; those of ``label`` a killed process left are removed first."""
    stem = Path(tempfile.gettempdir()) / f"stage-{label}"
    remove_stale(stem)
    folder = Path(tempfile.mkdtemp(prefix=_temp_prefix(stem, "tmp"), dir=stem.parent))
    try:
        yield folder
    finally:
        with _signals_blocked():
            shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- STAGE's marks


def stage_mark() -> dict[str, str]:
    """``{"stage_version": ...}``: the first key of every JSON document STAGE writes."""
    return {STAGE_MARK: __version__}


def png_metadata() -> dict[str, str]:
    """The PNG text chunk STAGE's plots carry (``savefig(..., metadata=png_metadata())``)."""
    return {"Software": f"stage {__version__}"}


def write_figure(path: str | os.PathLike, fig, flag: str = "--plot", **rule) -> Path:
    """A matplotlib figure written as a PNG by the output rule (:func:`write_output`, ``rule``
    its keyword arguments: ``force``, ``inputs``...), marked as STAGE's (:func:`png_metadata`),
    at 120 dpi; returns where it went.  The figure is closed (``pyplot.close``) either way."""
    try:
        return write_output(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png", metadata=png_metadata()), flag,
                            **rule)
    finally:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(fig)


_JSON_MARK = re.compile(rb'^\s*\{\s*(?:"otherData"\s*:\s*\{\s*)?"' + STAGE_MARK.encode() + rb'"\s*:')


def recognized(path: Path) -> bool:
    """Whether STAGE wrote the file at ``path``, from the mark it puts in each format: a
    JSON document whose first key is ``"stage_version"`` (or a Chrome trace whose
    ``otherData`` starts with it), a PNG whose ``Software`` text says ``stage``."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_HEAD_BYTES)
    except OSError:
        return False
    if path.suffix.lower() == ".json":
        return _JSON_MARK.match(head) is not None
    if path.suffix.lower() == ".png":
        return _png_software(head).startswith("stage ")
    return False


def _png_software(head: bytes) -> str:
    if not head.startswith(b"\x89PNG\r\n\x1a\n"):
        return ""
    pos = 8
    while pos + 8 <= len(head):
        size, kind = int.from_bytes(head[pos:pos + 4], "big"), head[pos + 4:pos + 8]
        if kind == b"tEXt":
            key, _, value = head[pos + 8:pos + 8 + size].partition(b"\0")
            if key == b"Software":
                return value.decode("latin-1")
        if kind == b"IDAT":
            return ""
        pos += 12 + size
    return ""
