"""STAGE adapter for ASTRA-sim: configs, runner and result parser.

``stage astrasim DIR`` writes the ASTRA-sim system / network / memory configs for a
trace set (and, for the htsim backend, its fat tree), runs the simulator with the
analytical, congestion-aware or htsim network (or prints the command to run it), and
reports per-rank finish times, compute, communication and why ranks did not finish.

The logic is callable without the CLI: :func:`simulate_set` returns a result record,
:func:`run_astrasim` is the whole command.
"""

from .command import run_astrasim
from .parser import parse_stdout
from .simulate import SimRun, simulate_set

__version__ = "0.1.0"
__all__ = ["run_astrasim", "simulate_set", "SimRun", "parse_stdout", "__version__"]
