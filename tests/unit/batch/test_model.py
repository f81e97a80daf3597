"""batch/model.py: the job's model found and loaded by the engine's one entry, with its revision."""

from __future__ import annotations

from pathlib import Path

from maskserve.batch.model import load_job_model, model_folder
from maskserve.config.bounds import settings_from
from maskserve.config.model_configs import model_configs
from maskserve.engine import default_model_dir


def test_the_model_folder_is_the_default_models_a_folder_or_none_for_an_uncached_hub_id(bert_dir: Path) -> None:
    assert model_folder(None) == default_model_dir()
    assert model_folder(str(bert_dir)) == bert_dir
    assert model_folder("no-such-org/no-such-model") is None


def test_a_loaded_model_comes_with_its_folders_revision(bert_dir: Path) -> None:
    model, revision = load_job_model(model_configs(settings_from({"model": (str(bert_dir),), "threads": 1}))[0])
    assert model.encode("a")[0] == model.encode("b")[0]  # a tokenizer with its specials
    assert revision.startswith("sha256:") and len(revision) == len("sha256:") + 64
