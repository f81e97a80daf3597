"""A job's output while it runs: a folder of finished parts beside the output, and what made them.

Each part holds the output rows of one slice of the input (``--part-rows`` rows in file order),
written whole to a temporary name, flushed and renamed, so a part on disk is always complete: a
job killed at any point has lost only the slices it had not finished. ``job.json`` records what
the parts were made with (the input, the model and its revision, the task, its parameters, the
settings that change an answer); a run that finds parts made otherwise refuses to mix them in.
Once every part is there, they are joined into the output in input order and the folder removed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from maskserve.batch.formats import Row, RowWriter, id_type

MANIFEST = "job.json"
_PART = re.compile(r"^part-(\d{6})\.jsonl$")


class JobMismatch(ValueError):
    """Parts on disk were made by a job other than this one; the message says what changed."""


def parts_folder(output: Path) -> Path:
    """Where ``output``'s parts are kept while the job runs."""
    return output.with_name(output.name + ".parts")


def metadata_path(output: Path) -> Path:
    """The sidecar that describes a JSON Lines or CSV output (Parquet keeps it in its schema)."""
    return output.with_name(output.name + ".meta.json")


class Parts:
    """The parts folder of one output."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.folder = parts_folder(output)

    def start(self, manifest: dict[str, Any], overwrite: bool) -> None:
        """Open the folder for a job described by ``manifest``: a new one, or one whose parts were
        made by the same job (resumed); raises :class:`JobMismatch` otherwise."""
        if overwrite and self.folder.exists():
            shutil.rmtree(self.folder)
        found = self.folder / MANIFEST
        if found.exists():
            earlier = json.loads(found.read_text(encoding="utf-8"))
            changed = differences(earlier, manifest)
            if changed:
                raise JobMismatch(
                    f"{self.folder} holds parts of another job ({'; '.join(changed)}); run the same "
                    "command as before to finish it, or add --overwrite to start over"
                )
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        _write_atomically(found, json.dumps(manifest, indent=2, sort_keys=True).encode())

    def finished(self) -> dict[int, int]:
        """Each finished part's number and how many rows it holds."""
        done: dict[int, int] = {}
        if not self.folder.is_dir():
            return done
        for path in self.folder.iterdir():
            match = _PART.match(path.name)
            if match:
                with path.open("rb") as handle:
                    done[int(match.group(1))] = sum(1 for _ in handle)
        return done

    def write(self, number: int, rows: list[Row]) -> None:
        """Part ``number``, whole or not at all."""
        body = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
        _write_atomically(self.folder / f"part-{number:06d}.jsonl", body)

    def rows(self, count: int) -> Iterator[list[Row]]:
        """Parts 0..count-1's rows, a part at a time, in order."""
        for number in range(count):
            path = self.folder / f"part-{number:06d}.jsonl"
            with path.open(encoding="utf-8") as handle:
                yield [json.loads(line) for line in handle]

    def completed(self, manifest: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
        """The output's metadata when an earlier run of this same job finished it (nothing to do),
        None when it is still to be made; raises :class:`JobMismatch` when the output there was made
        by another job, unless ``overwrite``."""
        if overwrite or not self.output.exists() or self.folder.exists():
            return None
        earlier = self._output_metadata()
        if earlier is None or {key: earlier.get(key) for key in manifest} != manifest:
            raise JobMismatch(f"{self.output} exists and was not made by this job; add --overwrite to replace it")
        return earlier

    def _output_metadata(self) -> dict[str, Any] | None:
        if self.output.suffix == ".parquet":
            found = (pq.read_schema(self.output).metadata or {}).get(b"maskserve")
            return None if found is None else dict(json.loads(found))
        sidecar = metadata_path(self.output)
        return dict(json.loads(sidecar.read_text(encoding="utf-8"))) if sidecar.exists() else None

    def counts(self, count: int) -> tuple[int, int]:
        """Results and error rows in parts 0..count-1."""
        results = errors = 0
        for part in self.rows(count):
            for row in part:
                errors += "error" in row
                results += "error" not in row
        return results, errors

    def join(self, count: int, metadata: dict[str, Any]) -> None:
        """Write the output from parts 0..count-1 in input order, with its metadata, then remove
        the folder (after the output is in place: a kill between the two joins again)."""
        ids = [row["id"] for part in self.rows(count) for row in part]
        described = {"maskserve": json.dumps(metadata, sort_keys=True)}
        writer = RowWriter(self.output, id_type(ids), described if self.output.suffix == ".parquet" else None)
        try:
            for part in self.rows(count):
                writer.write(part)
            writer.commit()
        except BaseException:
            writer.abandon()
            raise
        if self.output.suffix != ".parquet":
            _write_atomically(metadata_path(self.output), json.dumps(metadata, indent=2, sort_keys=True).encode())
        shutil.rmtree(self.folder)


def differences(earlier: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """What differs between two manifests, each as ``key: before -> now``."""
    changed: list[str] = []
    for key in sorted(set(earlier) | set(now)):
        before, after = earlier.get(key), now.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            changed += differences(before, after, f"{prefix}{key}.")
        elif before != after:
            changed.append(f"{prefix}{key}: {before!r} -> {after!r}")
    return changed


def _write_atomically(path: Path, body: bytes) -> None:
    temporary = path.with_name(f".{path.name}.writing")
    with temporary.open("wb") as handle:
        handle.write(body)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
