"""What the model repository extension's REST routes (``api/repository.py``) and RPCs
(``rpc/servicer.py``) share: the control when it is on, a model's name checked, a load's settings,
the index's entries. Across ``--workers``: ``request/across_workers.py``.
"""

from __future__ import annotations

import re
from typing import Any

from maskserve.config.model_repository import config_overrides
from maskserve.config.model_settings import NAME_PATTERN
from maskserve.config.settings import NamedSettingsError
from maskserve.errors import ExtensionOff, InvalidInput, ModelConfigInvalid
from maskserve.service.model_catalog import IndexEntry
from maskserve.service.model_control import ModelControl
from maskserve.service.registry import FillMaskService


def control_of(service: FillMaskService) -> ModelControl:
    """The model control, when the extension is on; a 404 as on a server without it otherwise."""
    control = service.control
    if control is None or not control.allows_changes:
        raise ExtensionOff("the model repository extension is off here (--model-control-mode none)")
    return control


def checked_name(control: ModelControl, name: str) -> str:
    """``name`` when it is a model this server knows; a 404 otherwise, before anything is loaded
    or forwarded (a name that is no model name never reaches a sibling's URL)."""
    if re.fullmatch(NAME_PATTERN, name) and control.knows(name):
        return name
    raise control.unknown(name)


def entry_json(entry: IndexEntry) -> dict[str, Any]:
    """One index entry as Triton writes it, with the model's measured memory beside."""
    found: dict[str, Any] = {"name": entry.name, "version": entry.version, "state": entry.state}
    if entry.reason:
        found["reason"] = entry.reason
    if entry.memory_bytes is not None:
        found["memory_bytes"] = entry.memory_bytes
    return found


def load_overrides(name: str, parameters: dict[str, Any]) -> dict[str, Any] | None:
    """A load's ``parameters.config`` as settings (a JSON object, as a string); Triton's ``file:``
    parameters (model files sent in the request) are refused: models come from the repository only."""
    for key in parameters:
        if key.startswith("file:"):
            raise InvalidInput(
                f"parameters.{key}: models are loaded from the repository folder; files cannot be sent",
                field=f"parameters.{key}",
            )
    config = parameters.get("config")
    if config is None:
        return None
    if not isinstance(config, str):
        raise InvalidInput("parameters.config must be a string holding a JSON object", field="parameters.config")
    try:
        return config_overrides(config)
    except NamedSettingsError as exc:
        raise ModelConfigInvalid(f"model {name!r}: {exc}") from None
