"""The built-in ``local`` executor: a pool of processes on this machine."""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterator, Mapping, Sequence

from stage_core.api import die_with_parent


def local(fn: Callable[[Any], Any], items: Sequence[Any], options: Mapping[str, Any]) -> Iterator[tuple[int, Any]]:
    """``fn`` over ``items`` in ``options["workers"]`` processes (default: every core; never
    more than the items).  A worker ends when this process does, however it ends.

    One worker runs in this process, without a pool.  Results are yielded as they
    arrive; at most two items per worker are in flight, so a long sweep never queues
    everything at once.
    """
    workers = min(int(options.get("workers") or os.cpu_count() or 1), len(items))  # never more than the items
    if workers <= 1:
        for i, item in enumerate(items):
            yield i, fn(item)
        return
    with ProcessPoolExecutor(max_workers=workers, initializer=die_with_parent) as pool:  # (no orphan goes on)
        pending: dict = {}
        queue = iter(enumerate(items))
        for i, item in queue:
            pending[pool.submit(fn, item)] = i
            if len(pending) >= 2 * workers:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield pending.pop(future), future.result()
                for i, item in queue:
                    pending[pool.submit(fn, item)] = i
                    break
