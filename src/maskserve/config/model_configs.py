"""Which models one server serves, by name, each with its own settings: from ``--model`` and ``--models-file``.

``--model NAME=SOURCE`` may be given several times (a bare SOURCE is named by its folder or hub
name; a lone model by ``--model-name``, as before there were several); a YAML models file adds
models with their own backend, precision and limits. Each model gets the server's settings with
its own overrides applied (``model_settings.py``), checked as the server's are (the same parsers,
the same contradictions), so every layer below reads one :class:`~maskserve.config.settings.Settings`
per model.
Pure: no torch, no HTTP.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from maskserve.config.model_repository import ModelRepository
from maskserve.config.model_settings import (
    NAME_PATTERN,
    PER_MODEL_SETTINGS,
    ModelConfig,
    read_yaml,
    validated,
    with_overrides,
)

# Both live in model_settings.py; "as" names them here too, for the modules that import them from here.
from maskserve.config.settings import NamedSettingsError, Settings

MODELS_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["models"],
    "additionalProperties": False,
    "properties": {
        "models": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": NAME_PATTERN},
                    # Absent: the default model (maskserve[demo]'s).
                    "source": {"type": "string", "minLength": 1},
                    **{key: {"type": ["string", "number", "boolean"]} for key in PER_MODEL_SETTINGS},
                },
            },
        }
    },
}


def source_name(source: str) -> str:
    """The name a bare SOURCE is served under: its folder's or hub id's last part, made a path segment."""
    last = Path(source.rstrip("/\\")).name or source
    name = re.sub(r"[^A-Za-z0-9._-]", "-", last).lstrip("._-")[:64]
    if not re.fullmatch(NAME_PATTERN, name):
        raise NamedSettingsError(f"--model {source!r}: cannot derive a name from it; give one as NAME={source}")
    return name


def _from_flag(spec: str, alone: bool, settings: Settings) -> ModelConfig:
    name, sep, source = spec.partition("=")
    if not sep:
        source, name = spec, (settings.model_name if alone else source_name(spec))
    elif not re.fullmatch(NAME_PATTERN, name):
        raise NamedSettingsError(
            f"--model {spec!r}: the name {name!r} must be 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit"
        )
    # NAME= (no source): the default model, under that name.
    return ModelConfig(name, source or None, settings)


def _from_file(path: str, settings: Settings) -> list[ModelConfig]:
    where = f"--models-file {path!r}"
    document = validated(read_yaml(Path(path), where), MODELS_FILE_SCHEMA, where)
    configs = []
    for entry in document["models"]:
        overrides = {key: value for key, value in entry.items() if key not in ("name", "source")}
        where = f"--models-file {path!r}: model {entry['name']!r}"
        configs.append(ModelConfig(entry["name"], entry.get("source"), with_overrides(settings, overrides, where)))
    return configs


def model_configs(settings: Settings) -> tuple[ModelConfig, ...]:
    """Every model the settings name, the default (first) one first; the default model alone when none.

    Raises :class:`~maskserve.config.settings.NamedSettingsError` on a bad name, a duplicate, or a models
    file that does not parse.
    """
    many = len(settings.model) + (settings.models_file is not None) > 1
    repository = _repository(settings)
    configs = [
        repository.config(spec, settings)
        if repository is not None and spec in repository.names()
        else _from_flag(spec, not many, settings)
        for spec in settings.model
    ]
    if settings.models_file is not None:
        configs += _from_file(settings.models_file, settings)
    if not configs and repository is not None and repository.names():
        # Nothing named: "none" serves the whole repository, as Triton does; the modes that load on
        # request preload its first model, so that POST / has a default from the start.
        names = repository.names()
        configs = [
            repository.config(name, settings)
            for name in (names if settings.model_control_mode == "none" else names[:1])
        ]
    if not configs:
        configs = [ModelConfig(settings.model_name, None, settings)]
    seen: set[str] = set()
    for config in configs:
        if config.name in seen:
            raise NamedSettingsError(f"two models are named {config.name!r}; each model needs its own name")
        seen.add(config.name)
    return tuple(configs)


def _repository(settings: Settings) -> ModelRepository | None:
    if settings.model_repository is None:
        return None
    repository = ModelRepository(settings.model_repository)
    if not repository.root.is_dir():
        raise NamedSettingsError(f"--model-repository {settings.model_repository!r}: no such folder")
    return repository


def check(settings: Settings) -> None:
    """The start-up check of ``--model`` and ``--models-file``: raises before anything loads."""
    model_configs(settings)
