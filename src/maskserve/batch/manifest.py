"""What a job's output was made with: the input, the model and its revision, the task, its
parameters and the settings that change an answer. A resumed job compares it with the parts' own
(parts.py) and the finished output carries it (its Parquet metadata, or a ``.meta.json`` sidecar).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from maskserve import __version__
from maskserve.config.flags import GROUPS
from maskserve.config.model_settings import ModelConfig

# The settings whose values change what a row is answered: which model runs and how, and every
# limit a row is checked against (a row past one gets its error). The batching limits change only
# which rows share a pass, and stay free between runs.
ANSWER_SETTINGS: tuple[str, ...] = (
    *(name for name in GROUPS["model and backend"] if name in {"backend", "device", "dtype", "quantize"}),
    *(name for name in GROUPS["admission and limits"] if name not in {"request_timeout", "max_body_bytes"}),
)


def model_revision(folder: Path | None, source: str | None) -> str:
    """What names the model's weights exactly: a hub snapshot's commit, or a digest of every file
    of a local folder (its config, tokenizer and weights), so that a retrained model in the same
    folder is told apart."""
    if folder is None:
        return "unknown"
    if source is not None and not Path(source).exists() and folder.parent.name == "snapshots":
        return folder.name  # the hub cache names a snapshot by its commit
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def input_identity(path: Path) -> dict[str, Any]:
    """The input as it stands: a file changed since the parts were made is another input."""
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "modified_ns": stat.st_mtime_ns}


def manifest(
    *,
    input_path: Path,
    config: ModelConfig,
    revision: str,
    task: str,
    parameters: dict[str, Any],
    part_rows: int,
) -> dict[str, Any]:
    """The job's description, as its parts and its output record it (JSON's values: what a run
    reads back compares equal to what it would write)."""
    described = {
        "input": input_identity(input_path),
        "model": {"source": config.source or "default", "revision": revision},
        "task": task,
        "parameters": parameters,
        "settings": {name: getattr(config.settings, name) for name in ANSWER_SETTINGS},
        "part_rows": part_rows,
        "maskserve_version": __version__,
    }
    return dict(json.loads(json.dumps(described, default=str)))


def output_metadata(described: dict[str, Any], rows: int, errors: int) -> dict[str, Any]:
    """What the finished output records: its job's manifest, its rows and error rows, the metric
    (a scoring job's) and how texts longer than the model reads were read."""
    parameters = described["parameters"]
    metadata = {**described, "rows": rows, "errors": errors}
    if described["task"] == "score":
        metadata["metric"] = parameters.get("metric") or "original"
    # In windows of the model's length, unless the parameters refuse such texts.
    metadata["windows"] = parameters.get("long_text") or "window"
    return metadata
