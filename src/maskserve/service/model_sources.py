"""Where a load's configuration and files come from: the repository's folder as it is now (its
settings file read afresh), or the configuration named at start, with a load's own overrides on
top; and whether the folder holds a whole model before anything is evicted for it. No HTTP, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from maskserve.config.model_repository import ModelRepository, NotInRepository
from maskserve.config.model_settings import ModelConfig, with_overrides
from maskserve.config.settings import NamedSettingsError, Settings
from maskserve.errors import ModelConfigInvalid, ModelNotLoadable, NotFound

# The files whose sizes estimate a model's memory before it is loaded for the first time.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".pt", ".pth", ".h5")


def weights_bytes(source: str | None) -> int:
    """The size of a model's weight files in its folder; 0 when it has no folder here (a hub id)."""
    if source is None or not Path(source).is_dir():
        return 0
    return sum(p.stat().st_size for p in Path(source).iterdir() if p.suffix in WEIGHT_SUFFIXES)


def config_for_load(
    repository: ModelRepository | None,
    started: Mapping[str, ModelConfig],
    settings: Settings,
    name: str,
    overrides: dict[str, Any] | None,
) -> ModelConfig:
    """The configuration a load of ``name`` applies. A repository model's settings file is read
    afresh on every load, whether or not the model was named at start: a fault there is the
    folder's (409); a fault in the load's own overrides is the client's (400). A name that is
    neither in the repository now nor named at start (a folder deleted since) is a 404."""
    in_repository = repository is not None and name in repository.names()
    try:
        if repository is not None and in_repository:
            config = repository.config(name, settings)
        elif name in started:
            config = started[name]
        else:
            raise NotFound(f"no model named {name!r} in the model repository")
    except NotInRepository as exc:  # gone between the listing and the read
        raise NotFound(str(exc)) from None
    except NamedSettingsError as exc:
        raise ModelNotLoadable(str(exc)) from None
    if not overrides:
        return config
    try:
        if repository is not None and in_repository:
            return repository.config(name, settings, overrides)
        return ModelConfig(name, config.source, with_overrides(config.settings, overrides, f"model {name!r}"))
    except NamedSettingsError as exc:
        raise ModelConfigInvalid(str(exc)) from None


def check_files(repository: ModelRepository | None, name: str) -> None:
    """Refuse (409, naming what is missing) a repository model whose folder does not hold a whole
    model yet: a copy still under way."""
    if repository is None:
        return
    try:
        missing = repository.missing(name)
    except NotInRepository:
        return  # named at start from elsewhere: the engine checks its own source
    if missing:
        raise ModelNotLoadable(
            f"model {name!r} cannot be loaded: its folder lacks {', '.join(missing)} (a copy still under way?)"
        )
