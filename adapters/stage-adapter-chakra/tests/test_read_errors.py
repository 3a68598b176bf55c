"""Every exception the readers can raise reaches the user as one line (issue 9, point 2).

The readers (etread, jsonread, traceset, records and wire's framing) either raise a
ChakraReadError or catch a library's exception and turn it into one.  The first test
walks their source and lists every exception class they raise or catch; each must have
a corruption below that makes it happen.  The others make each happen and check the
line `stage validate` prints: exit status 1, the file, and the rank and byte offset
where they apply.
"""

from __future__ import annotations

import ast
import gzip
import json
import zlib
from pathlib import Path

import pytest
from stage_core.api import StageError, TraceReadError, main
from stage_core.testing import fresh_host

from stage_adapter_chakra import ChakraReadError, et, jsontrace, plugin, wire
from stage_adapter_chakra import etread as etread_module

PACKAGE = Path(etread_module.__file__).parent
#: the modules on the reading path, and the functions of wire.py that read
READERS = ("etread.py", "jsonread.py", "traceset.py", "records.py", "stampread.py", "parallelread.py",
           "convert.py")
WIRE_READERS = ("read_varint", "iter_frames", "read_frame", "split_frames")


def raised_and_caught() -> set[str]:
    """Names of the exception classes the reading code raises or catches."""
    names: set[str] = set()

    def visit(tree):
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                names.add(ast.unparse(exc))
            elif isinstance(node, ast.ExceptHandler) and node.type is not None:
                types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
                names.update(ast.unparse(t) for t in types)

    for module in READERS:
        visit(ast.parse((PACKAGE / module).read_text()))
    for node in ast.parse((PACKAGE / "wire.py").read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name in WIRE_READERS:
            visit(node)
    # "exc": a re-raise; "Exception": a worker of parallelread gives up on a file it cannot
    # decode, and this process decodes that file again (and raises what is listed here)
    return {n for n in names if n not in ("exc", "Exception")}


# --------------------------------------------------------------------------- a set to damage


@pytest.fixture
def good(job, tmp_path):
    folder = tmp_path / "set"
    et.write(job, folder)
    (folder / "comm_groups.json").write_text(json.dumps(job.comm_groups))
    (folder / "manifest.json").write_text(json.dumps({"stage_version": "0", "world_size": 4}))
    return folder


def records(path: Path) -> list[tuple[int, int]]:
    """(start, end) of every length-prefixed record of a trace file."""
    data = path.read_bytes()
    _, starts = wire.split_frames(data)
    return list(zip(starts, starts[1:]))


def truncate_in_a_record(d):
    path = d / "trace.2.et"
    start, end = records(path)[3]
    path.write_bytes(path.read_bytes()[:end - 3])
    return "rank 2", "trace.2.et", f"record at byte {start}: truncated"


def overlong_varint(d):
    path = d / "trace.1.et"
    start, _ = records(path)[2]
    path.write_bytes(path.read_bytes()[:start] + b"\xff" * 11)
    return "rank 1", "trace.1.et", f"record at byte {start}: varint longer than 10 bytes"


def corrupt_wire_type(d):
    path = d / "trace.3.et"
    start, end = records(path)[1]
    data = bytearray(path.read_bytes())
    data[start + 1] = 0x0F  # field 1 with wire type 7: no such wire type
    path.write_bytes(bytes(data))
    return "rank 3", "trace.3.et", f"record at byte {start}: Error parsing message"


def bad_utf8_name(d):
    path = d / "trace.0.et"
    data = path.read_bytes()
    path.write_bytes(data.replace(b"fwd_layer0", b"\xff\xfed_layer0", 1))  # as long: the framing holds
    start = next(s for s, e in records(path) if b"\xff\xfe" in path.read_bytes()[s:e])
    return "rank 0", "trace.0.et", f"record at byte {start}: Error parsing message"


def bad_header(d):
    path = d / "trace.0.et"
    path.write_bytes(b"\x02\x0f\x00" + path.read_bytes()[records(path)[1][0]:])
    return None, "trace.0.et", "no readable GlobalMetadata record"


def empty_file(d):
    (d / "trace.1.et").write_bytes(b"")
    return "rank 1", "trace.1.et", "byte 0: empty file"


def empty_first_file(d):
    (d / "trace.0.et").write_bytes(b"")
    return None, "trace.0.et", "byte 0: no readable GlobalMetadata record"


def no_version(d):
    path = d / "trace.2.et"
    body = path.read_bytes()[records(path)[1][0]:]
    path.write_bytes(wire.frame(b"") + body)
    return "rank 2", "trace.2.et", "byte 0: GlobalMetadata has no version"


def unreadable(d, monkeypatch):
    real = Path.read_bytes

    def read_bytes(self):
        if self.name == "trace.3.et":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    return "rank 3", "trace.3.et", "cannot read it (Permission denied)"


def gzip_cut(d):
    path = d / "trace.1.et"
    path.write_bytes(gzip.compress(path.read_bytes(), mtime=0)[:30])
    return "rank 1", "trace.1.et", "not a readable gzip file (Compressed file ended"


def gzip_corrupt(d):
    path = d / "trace.1.et"
    packed = bytearray(gzip.compress(path.read_bytes(), mtime=0))
    for i in range(10, len(packed)):  # the first flipped byte that breaks the deflate stream
        trial = bytearray(packed)
        trial[i] ^= 0xFF
        try:
            gzip.decompress(bytes(trial))
        except zlib.error:
            path.write_bytes(bytes(trial))
            return "rank 1", "trace.1.et", "not a readable gzip file (Error -3"
        except (OSError, EOFError):
            continue
    raise AssertionError("no byte of the gzip stream gives a zlib.error")


def gzip_bad_crc(d):
    path = d / "trace.1.et"
    packed = bytearray(gzip.compress(path.read_bytes(), mtime=0))
    packed[-8] ^= 0xFF  # the CRC-32 of the trailer
    path.write_bytes(bytes(packed))
    return "rank 1", "trace.1.et", "not a readable gzip file (CRC check failed"


def missing_rank(d):
    (d / "trace.2.et").unlink()
    return None, "set", "trace.2.et missing (the manifest's world size is 4)"


def extra_rank(d):
    (d / "trace.4.et").write_bytes((d / "trace.0.et").read_bytes())
    return None, "set", "trace.4.et is extra (the manifest's world size is 4)"


def gap_without_manifest(d):
    (d / "manifest.json").unlink()
    (d / "trace.1.et").unlink()
    return None, "set", "trace.<rank>.et missing for rank(s) [1]"


def two_prefixes(d):
    (d / "manifest.json").unlink()
    for path in d.glob("trace.*.et"):
        path.rename(d / path.name.replace("trace", "other"))
        (d / path.name.replace("trace", "third")).write_bytes(b"")
    return None, "set", "several trace prefixes ['other', 'third']"


def groups_not_json(d):
    (d / "comm_groups.json").write_text("{")
    return None, "comm_groups.json", "not JSON (Expecting property name"


def groups_not_utf8(d):
    (d / "comm_groups.json").write_bytes(b'{"1": [0, 1]\xff}')
    return None, "comm_groups.json", "byte 12: not UTF-8 text"


def groups_too_deep(d):
    (d / "comm_groups.json").write_text("[" * 100_000 + "]" * 100_000)
    return None, "comm_groups.json", "nested too deep"


def groups_a_folder(d):
    (d / "comm_groups.json").unlink()
    (d / "comm_groups.json").mkdir()
    return None, "comm_groups.json", "cannot read it (Is a directory)"


def groups_not_an_object(d):
    (d / "comm_groups.json").write_text("[[0, 1]]")
    return None, "comm_groups.json", "expected an object of pg_name -> [ranks]"


def groups_not_ranks(d):
    (d / "comm_groups.json").write_text('{"1": [0, true], "2": 5}')
    return None, "comm_groups.json", "group '1': [0, true] is not a list of rank numbers"


def manifest_world_not_int(d):
    (d / "manifest.json").write_text('{"stage_version": "0", "world_size": "4"}')
    return None, "manifest.json", "world_size '4' is not a positive integer"


def subset_not_ranks(d):
    (d / "manifest.json").write_text('{"world_size": 4, "subset": {"ranks": "x", "count": 1}}')
    return None, "manifest.json", "subset"


def subset_bad_shape(d):
    (d / "manifest.json").write_text('{"world_size": 4, "subset": ["0-1"]}')
    return None, "manifest.json", '"subset" must be'


def subset_count(d):
    (d / "manifest.json").write_text('{"world_size": 4, "subset": {"ranks": "0-1", "count": 3}}')
    return None, "manifest.json", '"subset" names 2 ranks but says "count": 3'


def subset_files(d):
    (d / "manifest.json").write_text('{"world_size": 4, "subset": {"ranks": "0-2", "count": 3}}')
    return None, "set", "the manifest names a subset of ranks; trace.<rank>.et present for rank(s) [3]"


def json_not_json(d):
    (d / "trace.1.json").write_text("{")
    return "rank 1", "trace.1.json", "not JSON"


def json_no_nodes(d):
    (d / "trace.2.json").write_text('{"metadata": {}}')
    return "rank 2", "trace.2.json", 'expected {"metadata": ..., "nodes": [...]}'


def json_bad_node(d):
    (d / "trace.3.json").write_text('{"metadata": {"version": "0.0.4"}, "nodes": [{"id": "x"}]}')
    return "rank 3", "trace.3.json", "node #0: Failed to parse id field"


def json_node_not_object(d):
    (d / "trace.3.json").write_text('{"metadata": {"version": "0.0.4"}, "nodes": [5]}')
    return "rank 3", "trace.3.json", "node #0"


def json_not_utf8(d):
    (d / "trace.0.json").write_bytes(b'{"nodes": []}\xff')
    return None, "trace.0.json", "byte 13: not UTF-8 text"


def json_too_deep(d):
    (d / "trace.2.json").write_text("[" * 100_000 + "]" * 100_000)
    return "rank 2", "trace.2.json", "nested too deep"


#: exception class (as the readers name it) -> corruptions that make it happen
TRIGGERS = {
    "ChakraReadError": [empty_file, missing_rank, extra_rank, gap_without_manifest, two_prefixes,
                        no_version, groups_not_an_object, groups_not_ranks, manifest_world_not_int,
                        subset_bad_shape, subset_count, subset_files, json_no_nodes],
    "BadRecord": [truncate_in_a_record, corrupt_wire_type],
    "wire.FrameError": [truncate_in_a_record],
    "FrameError": [overlong_varint],
    "ValueError": [overlong_varint],
    "DecodeError": [corrupt_wire_type, bad_utf8_name],
    "IndexError": [empty_first_file],
    "OSError": [unreadable, groups_a_folder, gzip_bad_crc],
    "EOFError": [gzip_cut],
    "zlib.error": [gzip_corrupt],
    "json.JSONDecodeError": [groups_not_json, json_not_json],
    "UnicodeDecodeError": [groups_not_utf8, json_not_utf8],
    "RecursionError": [groups_too_deep, json_too_deep],
    "UsageError": [subset_not_ranks],
    "json_format.ParseError": [json_bad_node],
    "TypeError": [json_node_not_object],
}
CASES = sorted({f for fs in TRIGGERS.values() for f in fs}, key=lambda f: f.__name__)


def test_every_exception_class_the_readers_raise_or_catch_has_a_corruption():
    assert raised_and_caught() <= set(TRIGGERS), raised_and_caught() - set(TRIGGERS)
    assert issubclass(ChakraReadError, StageError) and issubclass(ChakraReadError, ValueError)


@pytest.mark.parametrize("corrupt", CASES, ids=lambda f: f.__name__)
def test_each_is_one_line_naming_file_rank_and_byte(good, job, corrupt, capsys, monkeypatch):
    if corrupt.__name__.startswith("json_"):  # the chakra-json backend's set
        for path in good.glob("trace.*.et"):
            path.unlink()
        jsontrace.write(job, good)
    args = (good, monkeypatch) if corrupt is unreadable else (good,)
    rank, file, reason = corrupt(*args)
    status = main(["validate", str(good)], host=fresh_host((plugin, "chakra")))
    err = capsys.readouterr().err.strip()
    assert status == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"stage: error: {rank + ': ' if rank else ''}"), err
    assert file in err and reason in err, err


def test_the_error_keeps_where_it_happened(good):
    start = records(good / "trace.2.et")[3][0]
    truncate_in_a_record(good)
    with pytest.raises(TraceReadError) as info:
        list(etread_module.read(good).iter_ranks())
    assert (info.value.rank, Path(info.value.path).name, info.value.offset) == (2, "trace.2.et", start)
    for path in good.glob("trace.*.et"):
        path.unlink()
    with pytest.raises(ChakraReadError, match="set: no <prefix>.<rank>.et files"):
        etread_module.read(good)  # (the CLI says "holds no trace set of a known format", exit 2)
