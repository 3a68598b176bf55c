"""Without Ray installed the executor is still listed, and using it says how to install Ray."""

import builtins

import pytest

from stage_core.api import UsageError
from stage_executor_ray.plugin import run


def test_the_missing_extra_is_named_in_one_line(monkeypatch):
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(UsageError, match=r"pip install 'stage-executor-ray\[ray\]'"):
        list(run(abs, [1, -2], {}))
