"""The model repository's folder (config/model_repository.py): which folders are models, their
settings files, a load's overrides, names that try to leave it, and what a server of it serves
at start in each control mode."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from maskserve.config.bounds import settings_from
from maskserve.config.model_configs import model_configs
from maskserve.config.model_repository import ModelRepository, NotInRepository, config_overrides
from maskserve.config.settings import NamedSettingsError, Settings


@pytest.fixture
def repository(tmp_path: Path, model_repository: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(model_repository, root)
    (root / "notes").mkdir()  # a folder that is no model
    (root / "README.md").write_text("models\n", encoding="utf-8")
    return root


def test_only_folders_holding_a_model_are_models(repository: Path) -> None:
    assert ModelRepository(repository).names() == ["alpha", "beta", "gamma"]
    assert ModelRepository(repository / "nowhere").names() == []


def test_a_models_settings_file_then_a_loads_overrides_apply_over_the_servers(repository: Path) -> None:
    (repository / "beta" / "maskserve.yaml").write_text("max_top_k: 7\nmax_batch_size: 4\n", encoding="utf-8")
    config = ModelRepository(repository).config("beta", Settings(), {"max_top_k": 3})
    assert config.name == "beta" and config.source == str((repository / "beta").resolve())
    assert (config.settings.max_top_k, config.settings.max_batch_size) == (3, 4)
    assert ModelRepository(repository).config("gamma", Settings()).settings == Settings()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("max_top_k: [", "not valid YAML"),
        ("port: 9000\n", "maskserve.yaml: at the top level: Additional properties"),
        ("max_batch_size: 0\n", "max_batch_size"),
    ],
)
def test_a_bad_settings_file_is_named(repository: Path, content: str, message: str) -> None:
    (repository / "beta" / "maskserve.yaml").write_text(content, encoding="utf-8")
    with pytest.raises(NamedSettingsError, match=message):
        ModelRepository(repository).config("beta", Settings())


def test_a_loads_config_is_a_json_object() -> None:
    assert config_overrides('{"max_top_k": 3}') == {"max_top_k": 3}
    for text, message in (("{", "not JSON"), ("[1]", "JSON object")):
        with pytest.raises(NamedSettingsError, match=message):
            config_overrides(text)


def test_names_that_would_leave_the_repository_are_refused(repository: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(repository / "beta", outside)
    os.symlink(outside, repository / "escape")
    os.symlink(repository / "beta", repository / "beta-link")  # inside: a name of its own
    models = ModelRepository(repository)
    for name in ("..", ".", "../models/beta", "/etc", "escape", "notes", "nosuch", "a" * 65):
        with pytest.raises(NotInRepository):
            models.folder(name)
    assert "escape" not in models.names() and "beta-link" in models.names()


def test_at_start_none_serves_the_whole_repository_and_the_others_its_first_model(repository: Path) -> None:
    def served(**given: object) -> list[str]:
        return [config.name for config in model_configs(settings_from({"model_repository": str(repository), **given}))]

    assert served() == ["alpha", "beta", "gamma"]
    assert served(model_control_mode="explicit", control_key="k" * 16) == ["alpha"]
    assert served(model_control_mode="on-demand") == ["alpha"]
    assert served(model_control_mode="on-demand", model=("gamma",)) == ["gamma"]
    with pytest.raises(NamedSettingsError, match="no such folder"):
        model_configs(settings_from({"model_repository": str(repository / "nowhere")}))
