"""batch/parts.py: parts are whole or absent, a manifest of another job is refused naming what
changed, and the join writes the output in input order and removes the parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maskserve.batch.formats import read_rows
from maskserve.batch.parts import JobMismatch, Parts, differences, metadata_path

MANIFEST = {"task": "score", "model": {"source": "default", "revision": "sha256:1"}, "parameters": {}}


def test_parts_are_written_whole_and_counted(tmp_path: Path) -> None:
    parts = Parts(tmp_path / "out.jsonl")
    parts.start(MANIFEST, overwrite=False)
    parts.write(3, [{"id": 6, "result": 1}, {"id": 7, "error": {"type": "x", "message": "y"}}])
    parts.write(0, [{"id": 0, "result": 2}])
    assert parts.finished() == {3: 2, 0: 1}
    assert not [p for p in parts.folder.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_manifest_of_another_job_is_refused_naming_each_change(tmp_path: Path) -> None:
    parts = Parts(tmp_path / "out.jsonl")
    parts.start(MANIFEST, overwrite=False)
    parts.start(dict(MANIFEST), overwrite=False)  # the same job: resumed
    changed = {**MANIFEST, "model": {"source": "default", "revision": "sha256:2"}, "task": "fill-mask"}
    with pytest.raises(JobMismatch, match=r"model\.revision: 'sha256:1' -> 'sha256:2'; task: 'score' -> 'fill-mask'"):
        parts.start(changed, overwrite=False)
    parts.write(0, [{"id": 0, "result": 1}])
    parts.start(changed, overwrite=True)
    assert parts.finished() == {}


def test_the_join_writes_every_part_in_order_then_removes_them(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    parts = Parts(output)
    parts.start(MANIFEST, overwrite=False)
    parts.write(1, [{"id": "b", "result": 2}])
    parts.write(0, [{"id": "a", "result": 1}])
    parts.join(2, {**MANIFEST, "rows": 2})
    assert [row for rows in read_rows(output, 10) for row in rows] == [
        {"id": "a", "result": 1},
        {"id": "b", "result": 2},
    ]
    assert json.loads(metadata_path(output).read_text())["rows"] == 2
    assert not parts.folder.exists()


def test_differences_name_nested_keys() -> None:
    assert differences({"a": {"b": 1}, "c": 2}, {"a": {"b": 2}, "c": 2, "d": 3}) == ["a.b: 1 -> 2", "d: None -> 3"]
