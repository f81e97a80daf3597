"""One model's own settings: what a model may set apart from the server, and the server's settings
with those values applied.

The models file (``model_configs.py``) and the model repository (``model_repository.py``) both
give models their own settings: each reads its YAML, checks it against
:data:`MODEL_SETTINGS_SCHEMA` and applies it with :func:`with_overrides`, so both parse and refuse
a value as its flag is parsed and refused. This module imports neither of them. Pure: no torch,
no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from maskserve.config.bounds import contradictions, settings_from
from maskserve.config.flags import GROUPS
from maskserve.config.settings import NamedSettingsError, Settings, setting_fields
from maskserve.model_api import ModelSpec

# What a model may set for itself: how it runs, its batches, its queue and what it admits.
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


@dataclass(frozen=True)
class ModelConfig:
    """One served model: the name clients use, what to load, and its own settings."""

    name: str
    source: str | None  # a folder or hub id; None: the default model
    settings: Settings


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


def model_spec(config: ModelConfig) -> ModelSpec:
    """The model a configuration names, and how to load it (by its own settings)."""
    settings = config.settings
    return ModelSpec(
        model=config.source,
        backend=settings.backend,
        cache_dir=settings.resolved_cache_dir(),
        device=settings.device,
        dtype=settings.dtype,
        threads=settings.resolved_threads(),
        adaptive_threads=settings.adaptive_threads,
        quantize=settings.quantize,
    )
