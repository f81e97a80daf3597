"""Rows in and out of JSON Lines, CSV and Parquet files, picked by the file's extension.

Reading streams: a file of any size is read a slice of rows at a time (pyarrow's streaming CSV
and Parquet readers, JSON Lines a line at a time), so memory holds one slice, never the file.
Writing takes rows already in order and appends them; the final file is written beside its name
and renamed into place, so a reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

# The formats, by the extensions that name them.
FORMATS: dict[str, str] = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}

Row = dict[str, Any]

# What a JSON Lines row that cannot be read says in its error row (its id says where it is).
NOT_JSON = "the line is not JSON"
NOT_AN_OBJECT = "the line is not a JSON object"


class FormatError(ValueError):
    """A file this module cannot read or write: its extension, or its contents; the message names it."""


def file_format(path: Path) -> str:
    """``jsonl``, ``csv`` or ``parquet``, from ``path``'s extension."""
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        known = ", ".join(sorted(FORMATS))
        raise FormatError(f"{path}: unknown format {path.suffix or '(no extension)'!r}; use one of {known}")
    return found


def read_rows(path: Path, slice_rows: int) -> Iterator[list[Row]]:
    """The rows of ``path`` in file order, ``slice_rows`` at a time (the last slice may be shorter)."""
    kind = file_format(path)
    reader = {"jsonl": _jsonl_slices, "csv": _csv_slices, "parquet": _parquet_slices}[kind]
    pending: list[Row] = []
    for rows in reader(path):
        pending.extend(rows)
        while len(pending) >= slice_rows:
            yield pending[:slice_rows]
            pending = pending[slice_rows:]
    if pending:
        yield pending


def count_rows(path: Path) -> int:
    """How many rows ``path`` holds: Parquet's footer says; the text formats are read through once
    (far cheaper than the job)."""
    if file_format(path) == "parquet":
        return int(pq.ParquetFile(path).metadata.num_rows)
    return sum(len(rows) for rows in read_rows(path, 65536))


def columns(path: Path) -> list[str]:
    """The column names of ``path`` (for JSON Lines, every key of its first row)."""
    kind = file_format(path)
    if kind == "parquet":
        return list(pq.ParquetFile(path).schema_arrow.names)
    first = next(iter(read_rows(path, 1)), [])
    return list(first[0]) if first else []


def _jsonl_slices(path: Path) -> Iterator[list[Row]]:
    rows: list[Row] = []
    with path.open("rb") as lines:
        for line in lines:
            if not line.strip():
                continue  # a blank line (a trailing newline, an editor's) is no row
            try:
                row = json.loads(line)
            except ValueError:
                # A line that is not JSON is still a row, so that it gets its error row in place.
                row = {"__unreadable__": NOT_JSON}
            rows.append(row if isinstance(row, dict) else {"__unreadable__": NOT_AN_OBJECT})
            if len(rows) >= 4096:
                yield rows
                rows = []
    yield rows


def _csv_slices(path: Path) -> Iterator[list[Row]]:
    # Every column read as text: an id of digits stays the id it was written as, and a parameters
    # column holds JSON text either way.
    header = _csv_header(path)
    options = pa_csv.ConvertOptions(column_types={name: pa.string() for name in header}, strings_can_be_null=False)
    try:
        with pa_csv.open_csv(path, convert_options=options) as reader:
            for batch in reader:
                yield batch.to_pylist()
    except pa.ArrowInvalid as exc:
        raise FormatError(f"{path}: not a CSV file this job can read ({exc})") from None


def _csv_header(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as handle:
        return next(csv.reader(handle), [])


def _parquet_slices(path: Path) -> Iterator[list[Row]]:
    try:
        parquet = pq.ParquetFile(path)
    except pa.ArrowInvalid as exc:
        raise FormatError(f"{path}: not a Parquet file ({exc})") from None
    for batch in parquet.iter_batches(batch_size=4096):
        yield batch.to_pylist()


class RowWriter:
    """Appends rows to ``path`` in its format; :meth:`commit` renames the finished file into place.

    JSON Lines keeps ``result`` and ``error`` as JSON values; CSV and Parquet hold them as JSON
    text, one column each, since one column cannot hold every shape an answer takes.
    """

    def __init__(self, path: Path, id_type: pa.DataType, metadata: dict[str, str] | None = None) -> None:
        self.path = path
        self.kind = file_format(path)
        self.temporary = path.with_name(f".{path.name}.writing")
        self.schema = pa.schema(
            [("id", id_type), ("result", pa.string()), ("error", pa.string())],
            metadata={key.encode(): value.encode() for key, value in (metadata or {}).items()},
        )
        self._text: Any = None
        self._parquet: pq.ParquetWriter | None = None
        self._csv: pa_csv.CSVWriter | None = None
        if self.kind == "jsonl":
            self._text = self.temporary.open("w", encoding="utf-8")
        elif self.kind == "parquet":
            self._parquet = pq.ParquetWriter(self.temporary, self.schema)
        else:
            self._csv = pa_csv.CSVWriter(self.temporary, self.schema)

    def write(self, rows: Sequence[Row]) -> None:
        """Append ``rows``: each ``{"id": ..., "result": ...}`` or ``{"id": ..., "error": {...}}``."""
        if self._text is not None:
            for row in rows:
                self._text.write(json.dumps(row, ensure_ascii=False) + "\n")
            return
        table = pa.Table.from_pylist([_flat(row) for row in rows], schema=self.schema)
        if self._parquet is not None:
            self._parquet.write_table(table)
        elif self._csv is not None:
            self._csv.write_table(table)

    def commit(self) -> None:
        """Close the file, flush it to disk and move it into place."""
        self._close()
        _sync(self.temporary)
        os.replace(self.temporary, self.path)

    def abandon(self) -> None:
        """Close and remove the unfinished file."""
        self._close()
        with contextlib.suppress(FileNotFoundError):
            self.temporary.unlink()

    def _close(self) -> None:
        if self._text is not None:
            self._text.close()
            self._text = None
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self._csv is not None:
            self._csv.close()
            self._csv = None


def _flat(row: Row) -> Row:
    """A row for a columnar file: its answer or its error as JSON text, the other empty."""
    return {
        "id": row["id"],
        "result": json.dumps(row["result"], ensure_ascii=False) if "result" in row else None,
        "error": json.dumps(row["error"], ensure_ascii=False) if "error" in row else None,
    }


def id_type(ids: Sequence[Any]) -> pa.DataType:
    """The output's id column type: whole numbers when every id is one (row numbers, numeric ids),
    text otherwise."""
    integers = all(isinstance(value, int) and not isinstance(value, bool) for value in ids)
    return pa.int64() if integers else pa.string()


def _sync(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())
