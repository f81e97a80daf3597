"""The model repository (``--model-repository DIR``): a folder of models, each a local model folder
named as the model, with an optional ``maskserve.yaml`` of its own settings.

    models/
    ├── bert-base/              config.json, tokenizer and weights, as save_pretrained writes them
    │                           (a folder with only some of them is listed, and refused as incomplete)
    │   └── maskserve.yaml      optional: {backend: onnxruntime, max_batch_size: 16, ...}
    └── legal-bert/

A model's settings are the server's with the file's values applied, then a load's overrides (the
Open Inference Protocol's ``parameters.config``), each parsed and checked as a models file's entry
is. Names that come from requests never become paths: a name must be one path segment of the
route's pattern, name a folder directly inside the repository, and resolve inside it (a symlink
that leaves the repository is refused). Pure: no torch, no HTTP.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from maskserve.config.model_files import looks_like_model, missing_parts
from maskserve.config.model_settings import (
    MODEL_SETTINGS_SCHEMA,
    NAME_PATTERN,
    ModelConfig,
    read_yaml,
    validated,
    with_overrides,
)
from maskserve.config.settings import NamedSettingsError, Settings

# The per-model settings file inside a model's folder.
SETTINGS_FILE = "maskserve.yaml"


class NotInRepository(LookupError):
    """No model of that name is in the repository (or the name could not be one)."""


class ModelRepository:
    """One repository folder, read afresh on every call: a model copied in while serving is seen."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def names(self) -> list[str]:
        """Every model in the repository, by name (sorted)."""
        try:
            entries = list(self.root.iterdir())
        except OSError:
            return []
        found = []
        for entry in entries:
            try:
                self.folder(entry.name)
            except NotInRepository:
                continue
            found.append(entry.name)
        return sorted(found)

    def folder(self, name: str) -> Path:
        """The folder of the model named ``name``; :class:`NotInRepository` for any name that is not
        one path segment naming a model folder inside the repository."""
        if not re.fullmatch(NAME_PATTERN, name) or name in (".", ".."):
            raise NotInRepository(f"{name!r} cannot name a model (1-64 of A-Z a-z 0-9 . _ -)")
        root = self.root.resolve()
        # resolve() follows symlinks: a model folder that links out of the repository ends outside
        # it, and is refused as ".." would be.
        folder = (root / name).resolve()
        if folder == root or not folder.is_relative_to(root):
            raise NotInRepository(f"{name!r} leaves the model repository")
        if not folder.is_dir() or not looks_like_model(folder):
            raise NotInRepository(f"no model named {name!r} in the model repository")
        return folder

    def missing(self, name: str) -> list[str]:
        """What the model folder ``name`` lacks to be loaded (a copy still under way): empty for a
        whole model. Raises :class:`NotInRepository` as :meth:`folder` does."""
        return missing_parts(self.folder(name))

    def config(self, name: str, settings: Settings, overrides: dict[str, Any] | None = None) -> ModelConfig:
        """The model ``name`` with its settings file's values, then ``overrides`` (a load's).

        Raises :class:`NotInRepository`, or
        :class:`~maskserve.config.settings.NamedSettingsError` naming the file or override at fault.
        """
        folder = self.folder(name)
        values: dict[str, Any] = {}
        settings_file = folder / SETTINGS_FILE
        if settings_file.is_file():
            where = f"model {name!r}: {SETTINGS_FILE}"
            values |= validated(read_yaml(settings_file, where) or {}, MODEL_SETTINGS_SCHEMA, where)
        if overrides:
            values |= validated(overrides, MODEL_SETTINGS_SCHEMA, f"model {name!r}: the load's config")
        own = with_overrides(settings, values, f"model {name!r}") if values else settings
        return ModelConfig(name, str(folder), own)


def config_overrides(text: str) -> dict[str, Any]:
    """A load's ``parameters.config``: a JSON object of a models-file entry's settings."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise NamedSettingsError(f"the load's config is not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise NamedSettingsError("the load's config must be a JSON object of settings")
    return document
