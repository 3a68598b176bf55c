"""The adapter's files, by the core's one output rule (:func:`stage_core.api.write_output`).

The configs, the simulator's output and ``results.json`` live in the set's own
``astrasim`` folder, replaced as a whole through a temporary folder; a timeline or a
plot the user names is a file written beside its target and renamed, never over a
device, a link, a file of the set it shows or a file STAGE did not write (unless
``--force``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from stage_core.api import StageError, write_output, write_output_folder

#: what the adapter and the simulator put in a set's ``astrasim`` folder (the simulator
#: adds its ``log`` folder; ``hardware.json`` is a hardware file given as an object)
KNOWN = frozenset({"system.json", "network.yml", "memory.json", "logging.toml", "results.json", "stdout.txt",
                   "stderr.txt", "timeline.log", "hardware.json", "log", "topology.topo"})


def _ours(folder: Path) -> bool:
    """A folder of a previous run (what the simulator wrote beside its configs goes with
    them), or one holding only what a run puts there."""
    names = os.listdir(folder)
    return "system.json" in names and "network.yml" in names or all(n in KNOWN or n.startswith(".") for n in names)


def write_folder(target: Path, files: dict[str, str]) -> None:
    """Replace folder ``target`` by one holding exactly ``files`` ({name: text}), when it
    holds only what this adapter and the simulator put there."""
    write_output_folder(target, files, "stage astrasim", replaceable=_ours)


def write_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` in the ``astrasim`` folder this run wrote (the adapter's
    own).  When it cannot be written (a full disk), the folder goes too: a run leaves its
    whole folder or none."""
    try:
        write_output(path, text, "stage astrasim", within_set=True, force=True)
    except StageError as exc:
        shutil.rmtree(path.parent, ignore_errors=True)
        raise type(exc)(f"{str(exc).replace('; nothing was changed', '')}; the run's folder {path.parent} "
                        f"was removed") from None
