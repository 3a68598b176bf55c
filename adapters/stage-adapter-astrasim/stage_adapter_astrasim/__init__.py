"""STAGE adapter for ASTRA-sim: configs, runner and result parser.

``stage astrasim DIR`` writes the ASTRA-sim system / network / memory configs for a
trace set, runs the analytical simulator (or prints the command to run it), and
reports per-rank finish times, compute, communication and deadlocked ranks.

The logic is callable without the CLI: :func:`run_astrasim`.
"""

from .command import run_astrasim
from .parser import parse_stdout

__version__ = "0.1.0"
__all__ = ["run_astrasim", "parse_stdout", "__version__"]
