"""Registers the ``ray`` executor: every unit a Ray task.

``options["address"]`` (``stage sweep --address``), else ``$RAY_ADDRESS``, names an
existing cluster; with neither, Ray starts a local instance for the run.  A Ray
already initialised in this process (a test, a notebook) is used as it is.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Mapping, Sequence

from stage_core import hookimpl
from stage_core.api import UsageError
from stage_core.records import ExecutorSpec


def call(fn: Callable[[Any], Any], item: Any) -> Any:
    """The Ray task: ``fn`` travels by reference (module and name), so any importable
    function works, builtins included."""
    return fn(item)


def run(fn: Callable[[Any], Any], items: Sequence[Any], options: Mapping[str, Any]) -> Iterator[tuple[int, Any]]:
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray, which is not installed: "
                         "pip install 'stage-executor-ray[ray]'") from None
    started = False
    if not ray.is_initialized():
        address = options.get("address") or os.environ.get("RAY_ADDRESS") or None
        try:
            ray.init(address=address, log_to_driver=False, include_dashboard=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise UsageError(f"--address {address}: cannot reach a Ray cluster there ({exc})") from None
        started = True
    try:
        task = ray.remote(call)
        refs = {task.remote(fn, item): i for i, item in enumerate(items)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield refs[ref], ray.get(ref)
    finally:
        if started:
            ray.shutdown()


@hookimpl
def stage_executors():
    return [ExecutorSpec("ray", run, "each unit a Ray task (--address ADDR or $RAY_ADDRESS; else a local instance)",
                         options=("address",))]
