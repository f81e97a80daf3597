"""batch/formats.py: rows in and out of JSON Lines, CSV and Parquet, streamed a slice at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maskserve.batch.formats import FormatError, RowWriter, columns, count_rows, file_format, id_type, read_rows

ROWS = [
    {"id": 7, "result": [{"score": 0.5, "token_str": "é"}]},
    {"id": 8, "error": {"type": "no_mask_token", "message": "no [MASK]"}},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_written_rows_read_back_in_order_with_their_answers_and_errors(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"out{suffix}"
    writer = RowWriter(path, id_type([row["id"] for row in ROWS]))
    writer.write(ROWS[:1])
    writer.write(ROWS[1:])
    assert not path.exists()  # only once committed
    writer.commit()
    back = [row for rows in read_rows(path, 1) for row in rows]
    if suffix == ".jsonl":
        assert back == ROWS
        return
    # The columnar formats hold the answer and the error as JSON text, the other column empty.
    ids = [7, 8] if suffix == ".parquet" else ["7", "8"]  # CSV reads every column as text
    assert [row["id"] for row in back] == ids
    assert json.loads(back[0]["result"]) == ROWS[0]["result"] and not back[0]["error"]
    assert json.loads(back[1]["error"]) == ROWS[1]["error"] and not back[1]["result"]


def test_an_abandoned_output_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "out.parquet"
    writer = RowWriter(path, pa.int64())
    writer.write(ROWS)
    writer.abandon()
    assert list(tmp_path.iterdir()) == []


def test_a_large_file_is_read_in_slices_of_the_size_asked(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"text {i} [MASK]." for i in range(10_000)]}), path, row_group_size=3000)
    sizes = [len(rows) for rows in read_rows(path, 4096)]
    assert sizes == [4096, 4096, 1808]
    assert count_rows(path) == 10_000
    assert columns(path) == ["text"]


def test_csv_keeps_ids_as_written_and_reads_parameters_as_text(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text('id,text,parameters\n007,"a, [MASK].","{""top_k"": 2}"\n', encoding="utf-8")
    (row,) = next(read_rows(path, 10))
    assert row == {"id": "007", "text": "a, [MASK].", "parameters": '{"top_k": 2}'}


def test_a_json_lines_line_that_is_not_an_object_stays_a_row_in_its_place(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a [MASK]."}\n\nnot json\n[1, 2]\n{"text": "b [MASK]."}\n', encoding="utf-8")
    rows = next(read_rows(path, 10))
    assert [row.get("text") for row in rows] == ["a [MASK].", None, None, "b [MASK]."]
    assert rows[1] == {"__unreadable__": "the line is not JSON"}
    assert rows[2] == {"__unreadable__": "the line is not a JSON object"}
    assert count_rows(path) == 4  # the blank line is no row


def test_an_unknown_extension_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=r"unknown format '\.txt'; use one of \.csv, \.jsonl, \.ndjson, \.parquet"):
        file_format(tmp_path / "in.txt")


def test_ids_are_whole_numbers_only_when_every_id_is_one() -> None:
    assert id_type([0, 1, 2]) == pa.int64()
    assert id_type([0, "a"]) == pa.string()
    assert id_type([True]) == pa.string()
