"""What a long run shows while it works: one phase at a time, on stderr.

Every command that may run for more than a couple of seconds splits its work into
phases (planning, writing, validating, estimating N plans, simulating...) and runs
each inside :meth:`Progress.phase`::

    progress = Progress.for_args(args)            # --quiet: nothing
    with progress.phase("writing", total=8192, unit="ranks") as done:
        for rank in ...:
            ...
            done(1)

How it shows depends on where stderr goes:

* a terminal: a tqdm bar (a counter with the elapsed time for a phase without a
  total), drawn once the phase has run for ``delay`` seconds (default 2) and erased
  when it ends, so a quick command prints nothing more;
* anything else (a log file, a pipe, CI): plain lines, one when a phase that has run
  for ``delay`` seconds makes progress (at most one every ``interval`` seconds) and one
  when such a phase ends, each starting with ``stage <command>: `` and the phase's label;
* ``--quiet`` (mode ``"off"``): nothing.

``STAGE_PROGRESS`` (``bar``, ``lines`` or ``off``) overrides the choice (a test, or a
terminal that cannot draw a bar).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

#: seconds a phase runs before anything is shown of it
DELAY = 2.0
#: seconds between two plain lines of one phase (a log)
INTERVAL = 30.0
#: seconds between two redraws of a bar whose phase gives no count (its elapsed time)
TICK = 0.5
MODES = ("auto", "bar", "lines", "off")


def add_quiet_flag(p: argparse.ArgumentParser) -> None:
    """``-q/--quiet``: no progress shown (a bar on a terminal, lines in a log)."""
    p.add_argument("-q", "--quiet", action="store_true",
                   help="show no progress (by default a bar on a terminal, a line now and then in a log, for each "
                        "phase that runs longer than 2 s)")


class Progress:
    """Shows the phases of one run (see the module docstring)."""

    def __init__(self, mode: str = "auto", stream: TextIO | None = None, delay: float = DELAY,
                 interval: float = INTERVAL, prefix: str = "stage"):
        if mode not in MODES:
            raise ValueError(f"progress mode {mode!r}: one of {', '.join(MODES)}")
        self.stream = stream if stream is not None else sys.stderr
        if mode == "auto":
            mode = os.environ.get("STAGE_PROGRESS", "") or ("bar" if _is_terminal(self.stream) else "lines")
            mode = mode if mode in MODES[1:] else "lines"
        self.mode = mode
        self.delay = delay
        self.interval = interval
        self.prefix = prefix

    @classmethod
    def for_args(cls, args, **kw) -> "Progress":
        """The progress of a command whose parser has :func:`add_quiet_flag` (``--quiet``: off);
        its lines start with ``stage <command>:`` (never ``stage:``, which starts an error or
        a warning)."""
        command = getattr(args, "command", None)
        kw.setdefault("prefix", f"stage {command}" if command else "stage")
        return cls("off" if getattr(args, "quiet", False) else "auto", **kw)

    @contextmanager
    def phase(self, label: str, total: int | None = None, unit: str = "") -> Iterator[Callable[[int], None]]:
        """A phase of the run; yields ``done(n=1)``, told how many more of ``total`` are done
        (a phase without a total shows its elapsed time, and ``done`` may be left uncalled)."""
        if self.mode == "off":
            yield _nothing
        elif self.mode == "bar":
            with self._bar(label, total, unit) as done:
                yield done
        else:
            with self._lines(label, total, unit) as done:
                yield done

    def __call__(self, label: str, total: int | None = None, unit: str = ""):
        """``progress(label, total)``: :meth:`phase` (the ``progress`` argument of
        :func:`stage_core.flow.write_trace_set`)."""
        return self.phase(label, total, unit or "ranks")

    def iterate(self, items, label: str, unit: str = ""):
        """``items`` (a sequence), shown as a phase: each item counts one when the next is asked for."""
        with self.phase(label, len(items), unit) as done:
            for item in items:
                yield item
                done(1)

    # ------------------------------------------------------------------ a terminal
    @contextmanager
    def _bar(self, label: str, total: int | None, unit: str):
        from tqdm import tqdm

        options = dict(desc=label, total=total, delay=self.delay, leave=False, file=self.stream,
                       dynamic_ncols=True, unit=f" {unit}" if unit else "it", mininterval=TICK)
        if total is None:
            options["bar_format"] = "{desc}: {elapsed}" + (" ({n_fmt}{unit})" if unit else "")
        bar = tqdm(**options)
        stop = threading.Event()

        def tick():  # redraw now and then: a phase without a count (or a slow one) shows its time
            while not stop.wait(TICK):
                bar.update(0)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield lambda n=1: bar.update(n)
        finally:
            stop.set()
            ticker.join()
            bar.close()

    # ------------------------------------------------------------------ a log
    @contextmanager
    def _lines(self, label: str, total: int | None, unit: str):
        start = time.monotonic()
        state = {"n": 0, "said": start - self.interval + self.delay}
        lock = threading.Lock()

        def count() -> str:
            n = state["n"]
            if total:
                return f"{n:,} of {total:,}{' ' + unit if unit else ''} ({100 * n / total:.0f}%)"
            return f"{n:,}{' ' + unit if unit else ''}" if n else ""

        def say(text: str) -> None:
            print(f"{self.prefix}: {label}: {text}", file=self.stream, flush=True)

        def done(n: int = 1) -> None:
            with lock:
                state["n"] += n
                now = time.monotonic()
                if total and state["n"] >= total:
                    return  # (the phase's last line says so)
                if now - state["said"] >= self.interval and now - start >= self.delay:
                    state["said"] = now
                    say(f"{count()}, {now - start:,.0f} s".lstrip(", "))

        yield done
        seconds = time.monotonic() - start
        if seconds >= self.delay:
            say(f"{count() or 'done'} in {seconds:,.1f} s")


def _nothing(n: int = 1) -> None:
    return None


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
