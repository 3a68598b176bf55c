"""Writing a sweep's rows: CSV, JSON, or Parquet (with the ``parquet`` extra)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Sequence

from stage_core.api import UsageError

FORMATS = (".csv", ".json", ".parquet")


def check_path(path: Path) -> None:
    if path.suffix not in FORMATS:
        raise UsageError(f"-o {path}: unknown table format {path.suffix or '(no suffix)'!r}; "
                         f"valid: {', '.join(FORMATS)}")
    if path.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise UsageError(f"-o {path}: Parquet needs pyarrow (pip install 'stage-search[parquet]'); "
                             "or write .csv or .json") from None
    if path.exists() and path.is_dir():
        raise UsageError(f"-o {path}: is a folder; give a file name ending in {', '.join(FORMATS)}")


def write(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Write ``rows`` (missing values empty) through a temporary file, then rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({c: [r.get(c) for r in rows] for c in columns})
        pq.write_table(table, tmp)
    elif path.suffix == ".json":
        tmp.write_text(json.dumps([{c: r.get(c) for c in columns} for r in rows], indent=1) + "\n")
    else:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        tmp.write_text(buf.getvalue())
    tmp.replace(path)
