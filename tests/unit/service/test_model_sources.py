"""service/model_sources.py: a load's configuration and files, and whose fault each refusal is."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from maskserve.config.model_repository import ModelRepository
from maskserve.config.model_settings import ModelConfig
from maskserve.config.settings import Settings
from maskserve.errors import ModelConfigInvalid, ModelNotLoadable, NotFound
from maskserve.service.model_sources import check_files, config_for_load, weights_bytes


@pytest.fixture
def repository(model_repository: Path, tmp_path: Path) -> ModelRepository:
    root = tmp_path / "models"
    shutil.copytree(model_repository, root)
    return ModelRepository(root)


def test_a_load_applies_the_folders_settings_then_its_own(repository: ModelRepository) -> None:
    (repository.root / "beta" / "maskserve.yaml").write_text("max_top_k: 7\n", encoding="utf-8")
    config = config_for_load(repository, {}, Settings(), "beta", None)
    assert config.settings.max_top_k == 7 and config.source == str((repository.root / "beta").resolve())
    assert config_for_load(repository, {}, Settings(), "beta", {"max_top_k": 3}).settings.max_top_k == 3


def test_a_bad_settings_file_is_the_folders_fault_and_bad_overrides_the_clients(repository: ModelRepository) -> None:
    with pytest.raises(ModelConfigInvalid, match="max_batch_size"):
        config_for_load(repository, {}, Settings(), "beta", {"max_batch_size": 0})
    (repository.root / "beta" / "maskserve.yaml").write_text("no_such_setting: 1\n", encoding="utf-8")
    with pytest.raises(ModelNotLoadable, match=r"maskserve\.yaml"):
        config_for_load(repository, {}, Settings(), "beta", None)


def test_a_deleted_folder_is_a_404_unless_named_at_start(repository: ModelRepository) -> None:
    shutil.rmtree(repository.root / "gamma")
    with pytest.raises(NotFound, match="no model named 'gamma'"):
        config_for_load(repository, {}, Settings(), "gamma", None)
    started = ModelConfig("gamma", "/elsewhere/gamma", Settings())
    assert config_for_load(repository, {"gamma": started}, Settings(), "gamma", None) is started


def test_a_half_copied_folder_is_refused_naming_what_it_lacks(repository: ModelRepository) -> None:
    (repository.root / "gamma" / "model.safetensors").unlink()
    with pytest.raises(ModelNotLoadable, match=r"lacks weights \(model.safetensors or pytorch_model.bin\)"):
        check_files(repository, "gamma")
    check_files(repository, "beta")  # whole: nothing raised
    check_files(None, "anything")  # no repository: the engine checks its own source


def test_weights_are_the_weight_files_on_disk(repository: ModelRepository) -> None:
    folder = repository.root / "beta"
    assert weights_bytes(str(folder)) == (folder / "model.safetensors").stat().st_size
    assert weights_bytes(None) == 0 and weights_bytes("org/hub-model") == 0
