"""service/model_catalog.py: the index as the repository holds it now: copies under way listed as
not loadable, deleted folders forgotten unless they serve."""

from __future__ import annotations

import shutil
from pathlib import Path

from maskserve.config.model_repository import ModelRepository
from maskserve.config.model_settings import ModelConfig
from maskserve.config.settings import Settings
from maskserve.observability.metrics import Metrics
from maskserve.service.model_catalog import ModelCatalog
from maskserve.service.served_model import ModelTable


def catalog_of(root: Path) -> ModelCatalog:
    """A catalog of ``root`` whose server was started with alpha (so alpha is in its table)."""
    settings = Settings(model_repository=str(root))
    started = {"alpha": ModelConfig("alpha", str(root / "alpha"), settings)}
    table = ModelTable(settings, list(started.values()), Metrics())
    return ModelCatalog(ModelRepository(root), started, table, allows_changes=True)


def test_a_copy_under_way_is_listed_as_not_loadable_then_loadable_once_whole(
    model_repository: Path, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    shutil.copytree(model_repository, root)
    (root / "delta").mkdir()
    shutil.copy(root / "beta" / "config.json", root / "delta" / "config.json")
    catalog = catalog_of(root)
    entries = {entry.name: entry for entry in catalog.entries()}
    assert entries["delta"].state == "UNAVAILABLE" and entries["delta"].reason.startswith(
        "not loadable: its folder lacks"
    )
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        if (root / "beta" / name).exists():
            shutil.copy(root / "beta" / name, root / "delta" / name)
    assert {entry.name: entry for entry in catalog.entries()}["delta"].reason == "not loaded"


def test_a_deleted_folder_is_forgotten_unless_it_serves(model_repository: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(model_repository, root)
    catalog = catalog_of(root)
    assert {entry.name for entry in catalog.entries()} == {"alpha", "beta", "gamma"}
    shutil.rmtree(root / "gamma")
    shutil.rmtree(root / "alpha")  # alpha serves (named at start): still listed
    assert {entry.name for entry in catalog.entries()} == {"alpha", "beta"}
    assert not catalog.knows("gamma") and catalog.knows("alpha")
    assert "it holds 'alpha', 'beta'" in catalog.unknown("gamma").message


def test_not_loaded_says_what_would_load_it(model_repository: Path) -> None:
    catalog = catalog_of(model_repository)
    catalog.entries()
    message = catalog.not_loaded("beta").message
    assert "model 'beta' is not loaded (UNAVAILABLE: not loaded)" in message
    assert "POST /v2/repository/models/beta/load" in message
