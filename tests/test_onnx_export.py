"""The export cache: reused when nothing changed, never when the model did, and never half written."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForMaskedLM

from maskserve.engine import load_engine
from maskserve.model_api import ModelSpec, Query

from .conftest import HAS_ONNXRUNTIME, NO_ONNXRUNTIME
from .models import build_bert

pytestmark = pytest.mark.skipif(not HAS_ONNXRUNTIME, reason=NO_ONNXRUNTIME)

if HAS_ONNXRUNTIME:
    from maskserve.engine import onnx_export
    from maskserve.engine.export_cache import ExportFailed, export_to_cache
    from maskserve.engine.onnx_export import MODEL_FILE, export_graph, export_key
    from maskserve.engine.onnxruntime import OnnxFillMaskEngine, load_onnx_engine


def load(folder: Path, cache: Path) -> OnnxFillMaskEngine:
    return load_onnx_engine(ModelSpec(model=str(folder), backend="onnxruntime", cache_dir=cache, threads=1))


def entries(cache: Path) -> list[str]:
    """The cache's entries; temporary and discarded folders (dot-names) excluded."""
    root = cache / "onnx"
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


def top_answer(engine: Any, text: str = "paris is the [MASK] of france.") -> list[tuple[int, float]]:
    [[predictions]] = engine.predict([Query(engine.encode(text), 5)])
    return [(p["token"], p["score"]) for p in predictions]


@pytest.fixture
def fresh_bert(tmp_path: Path) -> Path:
    return build_bert(tmp_path / "bert")


def test_second_load_reuses_the_cache_without_exporting(
    fresh_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first = load(fresh_bert, cache)
    assert not first.export.reused and entries(cache) == [first.export.key]
    written = first.export.model_file.stat().st_mtime_ns

    def no_export(*args: object) -> None:
        raise AssertionError("exported again although the cache holds this model")

    monkeypatch.setattr(onnx_export, "export_graph", no_export)
    second = load(fresh_bert, cache)
    assert second.export.reused and second.export.key == first.export.key
    assert second.export.model_file.stat().st_mtime_ns == written
    assert top_answer(second) == top_answer(first)


def test_a_changed_weight_never_reuses_the_old_export(fresh_bert: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = load(fresh_bert, cache)
    model = AutoModelForMaskedLM.from_pretrained(str(fresh_bert))
    with torch.no_grad():
        # A different word wins the Paris sentence: the old graph would still answer the old one.
        model.get_output_embeddings().bias[before.tokenizer.convert_tokens_to_ids("river")] += 30.0
    model.save_pretrained(str(fresh_bert))
    after = load(fresh_bert, cache)
    assert after.export.key != before.export.key and not after.export.reused
    assert sorted(entries(cache)) == sorted([before.export.key, after.export.key])
    assert top_answer(after)[0][0] == after.tokenizer.convert_tokens_to_ids("river")
    torch_answer = top_answer(load_engine(str(fresh_bert), threads=1))
    assert [token for token, _ in top_answer(after)] == [token for token, _ in torch_answer]


def test_a_changed_config_never_reuses_the_old_export(fresh_bert: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = load(fresh_bert, cache)
    config_file = fresh_bert / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["layer_norm_eps"] = 0.5  # same weights, other answers
    config_file.write_text(json.dumps(config), encoding="utf-8")
    after = load(fresh_bert, cache)
    assert after.export.key != before.export.key and not after.export.reused


def test_the_key_ignores_where_the_model_was_read_from(fresh_bert: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(fresh_bert, tmp_path / "elsewhere"))
    keys = {export_key(AutoModelForMaskedLM.from_pretrained(str(folder)))[0] for folder in (fresh_bert, copy)}
    assert len(keys) == 1


def test_a_corrupt_cached_file_is_exported_again(
    fresh_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    first = load(fresh_bert, cache)
    data = first.export.model_file.read_bytes()
    first.export.model_file.write_bytes(data[: len(data) // 2])  # a crash mid-copy, a full disk...
    caplog.set_level(logging.WARNING, logger="maskserve.engine.export_cache")
    second = load(fresh_bert, cache)
    assert "unusable" in caplog.text and "model.onnx differs" in caplog.text
    assert not second.export.reused and second.export.key == first.export.key
    assert second.export.model_file.read_bytes() != data[: len(data) // 2]
    assert top_answer(second) == top_answer(first)


def test_an_entry_without_its_meta_file_is_exported_again(fresh_bert: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = load(fresh_bert, cache)
    (first.export.folder / "meta.json").unlink()
    assert not load(fresh_bert, cache).export.reused


def test_a_failed_check_publishes_nothing(fresh_bert: Path, tmp_path: Path) -> None:
    model = AutoModelForMaskedLM.from_pretrained(str(fresh_bert))
    key, parts = export_key(model)
    root = tmp_path / "cache" / "onnx"

    def refuse(model_file: Path) -> None:
        assert model_file.is_file()  # the graph exists, in a temporary folder
        raise ExportFailed("disagrees with torch")

    with pytest.raises(ExportFailed, match="disagrees"):
        export_to_cache(model, root, key, parts, refuse, build=export_graph, model_name=MODEL_FILE, what="ONNX")
    assert list(root.iterdir()) == []  # neither the entry nor its temporary folder


def test_losing_the_publish_race_keeps_the_other_process_entry(fresh_bert: Path, tmp_path: Path) -> None:
    model = AutoModelForMaskedLM.from_pretrained(str(fresh_bert))
    key, parts = export_key(model)
    root = tmp_path / "cache" / "onnx"

    def other_process_publishes_first(model_file: Path) -> str:
        (root / key).mkdir()
        (root / key / "model.onnx").write_bytes(b"theirs")
        return "checked"

    export, checked = export_to_cache(
        model, root, key, parts, other_process_publishes_first, build=export_graph, model_name=MODEL_FILE, what="ONNX"
    )
    assert checked == "checked" and export.folder == root / key and export.reused
    assert (root / key / "model.onnx").read_bytes() == b"theirs"
    assert [p.name for p in root.iterdir()] == [key]  # our temporary folder is gone


def test_an_unwritable_cache_dir_fails_the_export_naming_it(fresh_bert: Path, tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("", encoding="utf-8")
    with pytest.raises(ExportFailed, match="cannot write the export cache") as caught:
        load(fresh_bert, not_a_folder)
    assert str(not_a_folder) in str(caught.value) and "\n" not in str(caught.value)


def test_an_exporter_error_becomes_one_line(fresh_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Exporting the operator 'aten::fake' to ONNX is not supported.\nMore detail.")

    monkeypatch.setattr(torch.onnx, "export", fail)
    with pytest.raises(ExportFailed) as caught:
        load(fresh_bert, tmp_path / "cache")
    message = str(caught.value)
    assert (
        message == "could not export the model to ONNX: Exporting the operator 'aten::fake' to ONNX is not supported."
    )
    assert entries(tmp_path / "cache") == []
