"""Why a run ended: every rank finished, a deadlock, a time limit, a failure, or silence.

ASTRA-sim exits 0 whatever its ranks did, so the verdict comes from the output:

* ``finished``: a ``sys[r] finished`` line for every rank and exit status 0;
* ``failed``: a nonzero exit status (an assertion, a signal, a file it refused), whatever
  else the output says; never a deadlock;
* ``time_limit``: htsim ended its run at 4 s of simulated time (``Warning: Simulation
  timed out.``) with ranks unfinished.  htsim reports a deadlock the same way (its
  periodic events keep the clock running to 4 s); when the set passed ``stage
  validate`` (whose replay finds every deadlock the simulator has) it is the limit;
* ``deadlock``: the analytical binaries printed ``has unreleased nodes`` for ranks that
  hold nodes they can never complete;
* ``incomplete``: ranks printed no ``finished`` line and nothing says why.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from .parser import Markers
from .report import rank_ranges

FINISHED, FAILED, TIME_LIMIT, DEADLOCK, INCOMPLETE = "finished", "failed", "time_limit", "deadlock", "incomplete"


@dataclass(frozen=True)
class Outcome:
    status: str
    unfinished: tuple[int, ...]
    #: the one line the command prints for anything but ``finished``
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == FINISHED


def _status_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def classify(returncode: int, unfinished: list[int], world: int, markers: Markers, *, backend: str,
             validated: bool, stops_at_ns: int | None, stderr_tail: str = "", explanation: str | None = None,
             logs: str = "") -> Outcome:
    """The outcome of a run whose ranks ``unfinished`` printed no ``finished`` line."""
    who = f"ASTRA-sim ({backend})"
    stuck = tuple(unfinished)
    left = f"ranks {rank_ranges(list(stuck))} unfinished ({len(stuck)} of {world})" if stuck else "every rank finished"
    if returncode != 0:
        last = stderr_tail.strip().splitlines()[-1].strip() if stderr_tail.strip() else ""
        line = f"{who} {_status_text(returncode)} with {left}"
        if last:
            line += f": {last}"
        if explanation:
            line += f" ({explanation})"
        return Outcome(FAILED, stuck, line + (f"; see {logs}" if logs else ""))
    if not stuck:
        return Outcome(FINISHED, ())
    if markers.timed_out and stops_at_ns:
        limit = f"{stops_at_ns / 1e9:g} s"
        flows = ("" if markers.last_flow_ms is None
                 else f"; its last message ended at {markers.last_flow_ms:,.3f} ms")
        if validated:
            return Outcome(TIME_LIMIT, stuck,
                           f"{backend} stopped at its limit of {limit} of simulated time with {left}{flows}: the step "
                           "takes longer than htsim can simulate; use --backend analytical")
        return Outcome(TIME_LIMIT, stuck,
                       f"{backend} stopped at its limit of {limit} of simulated time with {left}{flows}: either the "
                       "step takes longer, or these ranks wait forever (htsim reports a deadlock only this way); "
                       "`stage validate DIR` tells which")
    if markers.unreleased:
        return Outcome(DEADLOCK, stuck, f"DEADLOCK: ranks {rank_ranges(list(stuck))} never finished "
                                        f"({len(stuck)} of {world})")
    return Outcome(INCOMPLETE, stuck,
                   f"{left}: they printed no 'finished' line, and {who} reported neither a deadlock nor an error "
                   f"(exit status 0)" + (f"; see {logs}" if logs else ""))
