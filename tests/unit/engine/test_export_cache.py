"""engine/export_cache.py: an entry is reused when nothing changed, never when the model did, and
never half written. The tests that load run on each graph backend; the others drive the cache
itself, with a stand-in graph."""

from __future__ import annotations

import importlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForMaskedLM, PreTrainedModel

from maskserve.engine import load_engine
from maskserve.engine.export_cache import ExportFailed, ExportRecipe, export_to_cache, key_of, model_parts
from tests.models import build_bert
from tests.unit.engine.conftest import Graph, top_answer


@pytest.fixture
def fresh_bert(tmp_path: Path) -> Path:
    """A model of the test's own, which it may change, cached in a folder of its own."""
    return build_bert(tmp_path / "bert")


def test_second_load_reuses_the_cache_without_making_the_graph(
    graph: Graph, fresh_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first = graph.load(fresh_bert, cache)
    assert not first.export.reused and graph.entries(cache) == [first.export.key]
    written = first.export.model_file.stat().st_mtime_ns

    def no_making(*args: object) -> None:
        raise AssertionError("made again although the cache holds this model")

    module, function = graph.maker
    monkeypatch.setattr(importlib.import_module(f"maskserve.engine.{module}"), function, no_making)
    second = graph.load(fresh_bert, cache)
    assert second.export.reused and second.export.key == first.export.key
    assert second.export.model_file.stat().st_mtime_ns == written
    assert top_answer(second) == top_answer(first)


def test_a_changed_weight_never_reuses_the_old_graph(graph: Graph, fresh_bert: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = graph.load(fresh_bert, cache)
    model = AutoModelForMaskedLM.from_pretrained(str(fresh_bert))
    with torch.no_grad():
        # A different word wins the Paris sentence: the old graph would still answer the old one.
        model.get_output_embeddings().bias[before.tokenizer.convert_tokens_to_ids("river")] += 30.0
    model.save_pretrained(str(fresh_bert))
    after = graph.load(fresh_bert, cache)
    assert after.export.key != before.export.key and not after.export.reused
    assert graph.entries(cache) == sorted([before.export.key, after.export.key])
    assert top_answer(after)[0][0] == after.tokenizer.convert_tokens_to_ids("river")
    torch_answer = top_answer(load_engine(str(fresh_bert), threads=1))
    assert [token for token, _ in top_answer(after)] == [token for token, _ in torch_answer]


def test_a_changed_config_never_reuses_the_old_graph(graph: Graph, fresh_bert: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = graph.load(fresh_bert, cache)
    config_file = fresh_bert / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["layer_norm_eps"] = 0.5  # same weights, other answers
    config_file.write_text(json.dumps(config), encoding="utf-8")
    after = graph.load(fresh_bert, cache)
    assert after.export.key != before.export.key and not after.export.reused


def test_the_key_says_whether_the_last_layer_reads_rows_only(graph: Graph, fresh_bert: Path) -> None:
    """The graph with the read-rows last layer and the whole-layer one are two entries, never one."""
    export_key = importlib.import_module(f"maskserve.engine.{graph.export_module}").export_key
    model = AutoModelForMaskedLM.from_pretrained(str(fresh_bert))
    (read, read_parts), (whole, whole_parts) = export_key(model, True), export_key(model, False)
    assert read != whole
    assert (read_parts["read_rows_last_layer"], whole_parts["read_rows_last_layer"]) == (True, False)


def test_the_key_ignores_where_the_model_was_read_from(graph: Graph, fresh_bert: Path, tmp_path: Path) -> None:
    export_key = importlib.import_module(f"maskserve.engine.{graph.export_module}").export_key
    copy = Path(shutil.copytree(fresh_bert, tmp_path / "elsewhere"))
    keys = {export_key(AutoModelForMaskedLM.from_pretrained(str(folder)), True)[0] for folder in (fresh_bert, copy)}
    assert len(keys) == 1


def test_a_corrupt_cached_file_is_made_again(
    graph: Graph, fresh_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    first = graph.load(fresh_bert, cache)
    weights = first.export.folder / graph.weights_file
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a bit flipped on disk
    # A new file in its place, not a rewrite: the first engine may map the old one, and rewriting
    # a mapped file in place would pull its weights from under it.
    (weights.parent / "corrupt").write_bytes(bytes(data))
    (weights.parent / "corrupt").replace(weights)
    caplog.set_level(logging.WARNING, logger="maskserve.engine.export_cache")
    again = graph.load(fresh_bert, cache)
    assert "unusable" in caplog.text and f"{graph.weights_file} differs" in caplog.text
    assert not again.export.reused and graph.entries(cache) == [first.export.key]
    assert [token for token, _ in top_answer(again)] == [token for token, _ in top_answer(first)]


def test_an_entry_without_its_meta_file_is_made_again(graph: Graph, fresh_bert: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = graph.load(fresh_bert, cache)
    (first.export.folder / "meta.json").unlink()
    assert not graph.load(fresh_bert, cache).export.reused


def test_an_unwritable_cache_dir_fails_the_load_naming_it(graph: Graph, fresh_bert: Path, tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("", encoding="utf-8")
    with pytest.raises(ExportFailed, match="cannot write the export cache") as caught:
        graph.load(fresh_bert, not_a_folder)
    assert str(not_a_folder) in str(caught.value) and "\n" not in str(caught.value)


# The cache itself, with a stand-in graph: what it does does not depend on the backend.
MODEL_FILE = "graph.bin"


def stand_in_graph(model: PreTrainedModel, folder: Path) -> dict[str, Any]:
    (folder / MODEL_FILE).write_bytes(b"ours")
    return {"made_by": "test"}


@pytest.fixture
def keyed(fresh_bert: Path) -> tuple[PreTrainedModel, str, dict[str, Any]]:
    model = AutoModelForMaskedLM.from_pretrained(str(fresh_bert))
    parts = model_parts(model)
    return model, key_of(parts), parts


def test_a_failed_check_publishes_nothing(keyed: tuple[PreTrainedModel, str, dict[str, Any]], tmp_path: Path) -> None:
    model, key, parts = keyed
    root = tmp_path / "cache"

    def refuse(model_file: Path) -> None:
        assert model_file.is_file()  # the graph exists, in a temporary folder
        raise ExportFailed("disagrees with torch")

    with pytest.raises(ExportFailed, match="disagrees"):
        export_to_cache(ExportRecipe(model, root, key, parts, refuse, stand_in_graph, MODEL_FILE, "test"))
    assert list(root.iterdir()) == []  # neither the entry nor its temporary folder


def test_losing_the_publish_race_keeps_the_other_process_entry(
    keyed: tuple[PreTrainedModel, str, dict[str, Any]], tmp_path: Path
) -> None:
    model, key, parts = keyed
    root = tmp_path / "cache"

    def other_process_publishes_first(model_file: Path) -> str:
        (root / key).mkdir()
        (root / key / MODEL_FILE).write_bytes(b"theirs")
        return "checked"

    export, checked = export_to_cache(
        ExportRecipe(model, root, key, parts, other_process_publishes_first, stand_in_graph, MODEL_FILE, "test")
    )
    assert checked == "checked" and export.folder == root / key and export.reused
    assert (root / key / MODEL_FILE).read_bytes() == b"theirs"
    assert [p.name for p in root.iterdir()] == [key]  # our temporary folder is gone


def test_a_builder_error_becomes_one_line_and_publishes_nothing(
    keyed: tuple[PreTrainedModel, str, dict[str, Any]], tmp_path: Path
) -> None:
    model, key, parts = keyed
    root = tmp_path / "cache"

    def fail(model: PreTrainedModel, folder: Path) -> dict[str, Any]:
        raise RuntimeError("Exporting the operator 'aten::fake' is not supported.\nMore detail.")

    with pytest.raises(ExportFailed) as caught:
        export_to_cache(ExportRecipe(model, root, key, parts, lambda path: None, fail, MODEL_FILE, "test"))
    assert (
        str(caught.value) == "could not export the model to test: Exporting the operator 'aten::fake' is not supported."
    )
    assert list(root.iterdir()) == []
