"""Writing a sweep's rows: CSV, JSON, or Parquet (with the ``parquet`` extra), by STAGE's
output rule (:func:`stage_core.api.write_output`): an existing table is replaced only when
a sweep wrote it (its header, or the ``stage_version`` in a Parquet file's metadata) or
with ``--force``; never a device, a link, a file of a trace set or the spec it reads."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any, Sequence

from stage_core.api import UsageError, check_output_file, stage_mark, write_output

FORMATS = (".csv", ".json", ".parquet")
#: how a sweep's own table starts: its first column is the unit id
_CSV_HEAD = re.compile(rb"^unit,[^\n]*\bstatus\b[^\n]*\berror\r?\n")
_JSON_HEAD = re.compile(rb'^\s*\[\s*(\]|\{\s*"unit"\s*:)')


def written_by_a_sweep(path: Path) -> bool:
    """Whether the table at ``path`` is one ``stage sweep`` wrote (so a rerun may replace it)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(1 << 16)
    except OSError:
        return False
    if path.suffix == ".csv":
        return _CSV_HEAD.match(head) is not None
    if path.suffix == ".json":
        return _JSON_HEAD.match(head) is not None
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            meta = pq.read_schema(path).metadata or {}
        except Exception:  # (not Parquet, or pyarrow absent: not a table of ours)
            return False
        return b"stage_version" in meta
    return False


def check_path(path: Path, inputs: Sequence[Path] = (), force: bool = False) -> None:
    """Refuse, before any work, a table path the sweep may not write."""
    if path.suffix not in FORMATS:
        raise UsageError(f"-o {path}: unknown table format {path.suffix or '(no suffix)'!r}; "
                         f"valid: {', '.join(FORMATS)}")
    if path.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise UsageError(f"-o {path}: Parquet needs pyarrow (pip install 'stage-search[parquet]'); "
                             "or write .csv or .json") from None
    check_output_file(path, "-o", inputs=inputs, force=force, ours=written_by_a_sweep)


def write(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]], inputs: Sequence[Path] = (),
          force: bool = False) -> Path:
    """Write ``rows`` (missing values empty) through a temporary file, then rename."""
    rule = dict(inputs=inputs, force=force, ours=written_by_a_sweep)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({c: [r.get(c) for r in rows] for c in columns})
        table = table.replace_schema_metadata({k.encode(): v.encode() for k, v in stage_mark().items()})
        return write_output(path, lambda tmp: pq.write_table(table, tmp), "-o", **rule)
    if path.suffix == ".json":
        text = json.dumps([{c: r.get(c) for c in columns} for r in rows], indent=1) + "\n"
        return write_output(path, text, "-o", **rule)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return write_output(path, buf.getvalue(), "-o", **rule)
