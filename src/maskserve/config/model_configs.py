"""Which models one server serves, by name, each with its own settings: from ``--model`` and ``--models-file``.

``--model NAME=SOURCE`` may be given several times (a bare SOURCE is named by its folder or hub
name; a lone model by ``--model-name``, as before there were several); a YAML models file adds
models with their own backend, precision and limits. Each model gets the server's settings with
its own overrides applied, checked as the server's are (the same parsers, the same
contradictions), so every layer below reads one :class:`~maskserve.config.settings.Settings` per model.
Pure: no torch, no HTTP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import yaml

from maskserve.config.bounds import contradictions, settings_from
from maskserve.config.flags import GROUPS
from maskserve.config.settings import NamedSettingsError, Settings, setting_fields

if TYPE_CHECKING:
    from maskserve.config.model_repository import ModelRepository

# What a models file may set per model: how it runs, its batches, its queue and what it admits.
# The server's own settings stay one per server: which models and where their exports go, the
# request timeout (the door fixes each deadline before a page's form names its model), the body
# limit (the app's, before any route is known), and every group of server, connection and
# operations settings.
SERVER_WIDE = frozenset({"model", "models_file", "model_name", "cache_dir", "request_timeout", "max_body_bytes"})
PER_MODEL_SETTINGS: tuple[str, ...] = tuple(
    name
    for group in ("model and backend", "batching", "admission and limits")
    for name in GROUPS[group]
    if name not in SERVER_WIDE
)

# The path-segment rule the routes carry a name in (the same as --model-name's).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

# One model's own settings: a models file's entry, a repository model's settings file, a load's config.
MODEL_SETTINGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {key: {"type": ["string", "number", "boolean"]} for key in PER_MODEL_SETTINGS},
}

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


@dataclass(frozen=True)
class ModelConfig:
    """One served model: the name clients use, what to load, and its own settings."""

    name: str
    source: str | None  # a folder or hub id; None: the default model
    settings: Settings


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


def with_overrides(settings: Settings, overrides: dict[str, Any], where: str) -> Settings:
    """``settings`` with a models file's values, each parsed by its setting's own parser."""
    fields = {f.name: f for f in setting_fields()}
    values: dict[str, Any] = {}
    for key, raw in overrides.items():
        text = ("true" if raw else "false") if isinstance(raw, bool) else str(raw)
        try:
            values[key] = fields[key].metadata["parse"](text)
        except ValueError as exc:
            raise NamedSettingsError(f"{where}: {key}: invalid value {raw!r} ({exc})") from None
    # The model's own values and the server's written ones are fixed; every other default moves
    # to fit them afresh (a server-wide default that followed --max-queue 8 does not bind a model
    # whose file entry sets max_queue: 512).
    own = settings_from({name: getattr(settings, name) for name in settings.given} | values)
    for first, second, reason in contradictions(own):
        raise NamedSettingsError(
            f"{where}: {first}={getattr(own, first)!r} contradicts {second}={getattr(own, second)!r}: {reason}"
        )
    return own


def read_yaml(path: Path, where: str) -> Any:
    """A settings file's YAML; a refusal naming ``where`` when it cannot be read or parsed."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise NamedSettingsError(f"{where}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise NamedSettingsError(f"{where}: not valid YAML ({exc})") from None


def validated(document: Any, schema: dict[str, Any], where: str) -> Any:
    """``document`` when ``schema`` holds it; a refusal naming ``where`` and the place at fault."""
    try:
        jsonschema.validate(document, schema)
    except jsonschema.ValidationError as exc:
        at = "/".join(str(part) for part in exc.absolute_path) or "the top level"
        raise NamedSettingsError(f"{where}: at {at}: {exc.message}") from None
    return document


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
    # Imported here: the repository builds its models' configs with this module's parsers.
    from maskserve.config.model_repository import ModelRepository

    if settings.model_repository is None:
        return None
    repository = ModelRepository(settings.model_repository)
    if not repository.root.is_dir():
        raise NamedSettingsError(f"--model-repository {settings.model_repository!r}: no such folder")
    return repository


def check(settings: Settings) -> None:
    """The start-up check of ``--model`` and ``--models-file``: raises before anything loads."""
    model_configs(settings)
