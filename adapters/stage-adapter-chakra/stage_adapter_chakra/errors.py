"""The adapter's own errors (both are ValueErrors, so callers may catch either)."""

from __future__ import annotations


class ChakraWriteError(ValueError):
    """A program cannot be written as Chakra ET; the message names the node or rank."""


class ChakraReadError(ValueError):
    """A file or directory is not a readable Chakra trace set; the message names it."""
