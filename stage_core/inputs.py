"""Reading a file the user names: regular files only, bounded in size, JSON bounded in depth.

A FIFO given as ``--model`` would block the read forever, a device would never end,
and a JSON document nested 50,000 deep or holding a 5,000-digit number makes Python's
parser raise what is not a user's message.  :func:`read_input` and :func:`read_json`
turn each into one line naming the file (:class:`~stage_core.errors.UsageError`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from .errors import UsageError

#: the largest input file read whole (a config.json, a hardware file, a sweep spec)
MAX_INPUT_BYTES = 64 << 20


def read_input(path: str | os.PathLike, label: str, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file at ``path``; ``label`` starts every message (``--model
    config.json``).  A FIFO, device, socket or folder, or a file above ``max_bytes``, is
    refused without waiting on it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # (a FIFO opens at once)
    except OSError as exc:
        raise UsageError(f"{label}: cannot read it ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{label}: cannot read it ({os.strerror(errno.EISDIR)})")
        if not stat.S_ISREG(info.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device or socket"
            raise UsageError(f"{label}: cannot read it (not a regular file but {kind}); give a file")
        if info.st_size > max_bytes:
            raise UsageError(f"{label}: is {info.st_size:,} bytes, above the {max_bytes:,} STAGE reads")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:  # (it grew while being read)
                raise UsageError(f"{label}: is above the {max_bytes:,} bytes STAGE reads")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise UsageError(f"{label}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, label: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """:func:`read_input` as UTF-8 text (a byte that is not: one line with its offset)."""
    data = read_input(path, label, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{label}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def read_json(path: str | os.PathLike, label: str, max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """The JSON document in the file at ``path`` (:func:`read_text`), or one line saying
    why it is none: not JSON, nested too deep, a number too long for Python."""
    return parse_json(read_text(path, label, max_bytes), label)


def parse_json(text: str, label: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{label}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise UsageError(f"{label}: JSON nested too deep for STAGE (arrays or objects inside each other "
                         f"about a thousand times)") from None
    except ValueError as exc:  # a number of more than sys.get_int_max_str_digits() digits
        why = f"a number of more than {sys.get_int_max_str_digits():,} digits" if "digits" in str(exc) else exc
        raise UsageError(f"{label}: not JSON STAGE reads ({why})") from None


def is_regular(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file (following links), without opening it."""
    try:
        return stat.S_ISREG(os.stat(Path(path)).st_mode)
    except (OSError, ValueError):
        return False
