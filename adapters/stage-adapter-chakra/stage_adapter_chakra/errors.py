"""The adapter's own errors: STAGE errors (one line, exit status 1, never a traceback)
that are also ValueErrors, so callers may catch either."""

from __future__ import annotations

from stage_core.api import TraceReadError, TraceWriteError


class ChakraWriteError(TraceWriteError, ValueError):
    """A program cannot be written as Chakra ET; the message names the node or rank."""


class ChakraReadError(TraceReadError, ValueError):
    """A file or directory is not a readable Chakra trace set: the message names the
    file, and the rank and the byte offset where they apply."""
