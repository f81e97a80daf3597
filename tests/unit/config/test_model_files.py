"""config/model_files.py: a whole model folder passes; a copy cut short, or missing a part, is
named for what it lacks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from maskserve.config.model_files import looks_like_model, missing_parts


@pytest.fixture
def folder(model_repository: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "beta"
    shutil.copytree(model_repository / "beta", copy)
    return copy


def test_a_whole_model_lacks_nothing(folder: Path) -> None:
    assert looks_like_model(folder) and missing_parts(folder) == []


def test_weights_cut_short_are_incomplete(folder: Path) -> None:
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert missing_parts(folder) == ["model.safetensors (incomplete)"]


def test_a_folder_with_only_its_config_lacks_weights_and_a_tokenizer(folder: Path, tmp_path: Path) -> None:
    copy = tmp_path / "half"
    copy.mkdir()
    shutil.copy(folder / "config.json", copy / "config.json")
    assert looks_like_model(copy)
    missing = missing_parts(copy)
    assert missing[0] == "weights (model.safetensors or pytorch_model.bin)" and missing[1].startswith("a tokenizer")


def test_a_config_that_is_not_json_is_named(folder: Path) -> None:
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    assert missing_parts(folder) == ["config.json (absent or not a JSON object)"]


def test_a_tokenizer_file_cut_short_does_not_count(folder: Path) -> None:
    tokenizer = folder / "tokenizer.json"
    text = tokenizer.read_text(encoding="utf-8")
    tokenizer.write_text(text[: len(text) // 2], encoding="utf-8")
    for other in ("vocab.txt", "vocab.json", "merges.txt"):
        (folder / other).unlink(missing_ok=True)
    assert missing_parts(folder)[-1].startswith("a tokenizer")


def test_a_shard_named_by_the_index_but_absent_is_named(folder: Path) -> None:
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    assert missing_parts(folder) == ["model-00002-of-00002.safetensors (absent or incomplete)"]


def test_a_folder_of_other_files_is_no_model(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    assert not looks_like_model(tmp_path)
