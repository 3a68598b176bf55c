"""The analytical network file: ``topology``, ``npus_count``, ``bandwidth``, ``latency``.

Format (astra-network-analytical ``NetworkParser``, examples ``input/Switch.yml`` and
astra-sim ``examples/network/analytical/*.yml``): one flow list per key, one entry per
dimension, bandwidth in GB/s (2^30 B) and latency in ns, e.g.::

    topology: [ Switch, Switch ]
    npus_count: [ 8, 4 ]
    bandwidth: [ 400.0, 44.44 ]  # GB/s
    latency: [ 936.25, 2643.5 ]  # ns

No YAML library is needed for this subset; :func:`read_flow_lists` reads it back (and
whatever flow-list keys a user's file has) for checks and tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEYS = ("topology", "npus_count", "bandwidth", "latency")

_LINE = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*:\s*\[(.*)\]\s*(?:#.*)?$")


@dataclass(frozen=True)
class NetworkDims:
    """Per-dimension lists of an analytical network."""

    topology: tuple[str, ...]
    npus_count: tuple[int, ...]
    bandwidth: tuple[float, ...]
    latency: tuple[float, ...]


def _num(value: float) -> str:
    text = repr(float(value))
    return text


def render(dims: NetworkDims, header: str = "") -> str:
    """The yml text of ``dims``; ``header`` becomes leading comment lines."""
    lines = [f"# {h}" for h in header.splitlines() if h]
    lines.append(f"topology: [ {', '.join(dims.topology)} ]")
    lines.append(f"npus_count: [ {', '.join(str(n) for n in dims.npus_count)} ]")
    lines.append(f"bandwidth: [ {', '.join(_num(b) for b in dims.bandwidth)} ]  # GB/s")
    lines.append(f"latency: [ {', '.join(_num(x) for x in dims.latency)} ]  # ns")
    return "\n".join(lines) + "\n"


def _scalar(text: str):
    text = text.strip().strip("'\"")
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def read_flow_lists(text: str) -> dict[str, list]:
    """Every ``key: [ a, b, ... ]`` line of ``text`` as ``{key: [values]}``."""
    found: dict[str, list] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            items = [s for s in match.group(2).split(",") if s.strip()]
            found[match.group(1)] = [_scalar(s) for s in items]
    return found
