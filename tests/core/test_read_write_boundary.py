"""Errors of any backend's reader or writer become one line at the core's boundary
(issue 9, point 2), even from a backend that raises plain Python errors."""

import pytest

from stage_core import hookimpl
from stage_core.cli import main
from stage_core.records import BackendSpec
from stage_core.testing import fresh_host, read_jsonl, toy_plugin, write_jsonl

from conftest import DP


def host_with(write=write_jsonl, read=read_jsonl):
    class Backend:
        @hookimpl
        def stage_trace_backends(self):
            return [BackendSpec("plain", write, read, lambda d: (d / "trace.0.jsonl").exists(), format_id="plain")]

    return fresh_host((toy_plugin, "toy"), (Backend(), "plain"), (DP(), "dp"))


def one_line(capsys, status, expected=1):
    err = capsys.readouterr().err.strip()
    assert status == expected and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def written(tmp_path, capsys):
    out = tmp_path / "set"
    assert main(["generate", "--model", "toy", "--dp", "2", "--format", "plain", "-o", str(out)],
                host=host_with()) == 0
    capsys.readouterr()
    return out


@pytest.mark.parametrize("error", [ValueError("bad line 3"), OSError(5, "Input/output error"),
                                   RecursionError("too deep"), EOFError("cut short")])
def test_a_plain_error_while_reading_a_rank_is_one_line(tmp_path, capsys, error):
    out = written(tmp_path, capsys)

    def read(folder):
        trace_set = read_jsonl(folder)
        inner = trace_set.iter_ranks

        def iter_ranks():
            for rank, nodes in inner():
                yield rank, nodes
                raise error  # after rank 0

        trace_set.iter_ranks = iter_ranks
        return trace_set

    err = one_line(capsys, main(["validate", str(out)], host=host_with(read=read)))
    assert err == f"stage: error: {out}: the plain reader failed on the rank after rank 0: {error}"


def test_a_plain_error_opening_a_set_is_one_line(tmp_path, capsys):
    out = written(tmp_path, capsys)

    def read(folder):
        raise ValueError("no header")

    err = one_line(capsys, main(["validate", str(out)], host=host_with(read=read)))
    assert err == f"stage: error: {out}: the plain reader cannot open it: no header"


def test_a_plain_error_of_a_writer_is_one_line_and_leaves_nothing(tmp_path, capsys):
    def write(job, folder):
        raise OverflowError("int too large to convert")

    status = main(["generate", "--model", "toy", "--format", "plain", "-o", str(tmp_path / "out")],
                  host=host_with(write=write))
    err = one_line(capsys, status)
    # the backend's own failure, named (docs/plugins.md: plugin errors are one line naming the plugin)
    assert err == ("stage: error: plugin 'plain': trace backend 'plain': write failed: OverflowError: int too large "
                   "to convert")
    assert list(tmp_path.iterdir()) == []
