"""The job's model: loaded once, by the engine's one loading entry and the server's own settings,
and named by its exact revision (manifest.py) so that a resumed job can tell it is the same."""

from __future__ import annotations

from pathlib import Path

from maskserve.batch.manifest import model_revision
from maskserve.config.model_settings import ModelConfig, model_spec
from maskserve.model_api import FillMaskModel


def model_folder(source: str | None) -> Path | None:
    """The folder the model's files are in: the default model's, a local folder, or a hub id's
    snapshot in the local cache (None when it is in none of them)."""
    from maskserve.engine import default_model_dir

    if source is None:
        return default_model_dir()
    if Path(source).is_dir():
        return Path(source)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, local_files_only=True))
    except Exception:  # noqa: BLE001  # not in the cache as a snapshot: no exact revision to give
        return None


def load_job_model(config: ModelConfig) -> tuple[FillMaskModel, str]:
    """The model ``config`` names, loaded on its backend, and its revision."""
    from maskserve.engine import load

    model = load(model_spec(config))
    return model, model_revision(model_folder(config.source), config.source)
