"""batch/manifest.py: a model's revision changes with any of its files, and the manifest reads back
equal to itself."""

from __future__ import annotations

import json
from pathlib import Path

from maskserve.batch.manifest import manifest, model_revision, output_metadata
from maskserve.config.bounds import settings_from
from maskserve.config.model_configs import model_configs


def test_a_folders_revision_changes_with_any_file(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 10)
    first = model_revision(folder, str(folder))
    assert first.startswith("sha256:") and model_revision(folder, str(folder)) == first
    (folder / "model.safetensors").write_bytes(b"\1" + b"\0" * 9)  # same size, other weights
    assert model_revision(folder, str(folder)) != first


def test_a_hub_snapshot_is_named_by_its_commit(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--org--name" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    assert model_revision(snapshot, "org/name") == "0123abcd"
    assert model_revision(None, "org/name") == "unknown"


def test_the_manifest_reads_back_equal_and_records_the_answer_settings(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("{}\n")
    config = model_configs(settings_from({"default_top_k": 3, "port": 9000}))[0]
    described = manifest(
        input_path=source,
        config=config,
        revision="r",
        task="score",
        parameters={"metric": "within_word_l2r"},
        part_rows=5,
    )
    assert json.loads(json.dumps(described)) == described
    assert described["settings"]["default_top_k"] == 3 and "port" not in described["settings"]
    assert described["input"]["bytes"] == 3
    metadata = output_metadata(described, rows=4, errors=1)
    assert (metadata["metric"], metadata["windows"], metadata["rows"]) == ("within_word_l2r", "window", 4)
