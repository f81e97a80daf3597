"""This worker's part of a model repository change, and what it remembers of the loads it
applied: the load config of the model it serves (for a worker joining late), and the change a
fresh load belongs to (so that a change that failed on another worker is undone here, and only
that change).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from maskserve.errors import MaskserveError, ModelLoadFailed
from maskserve.service.model_control import ModelControl
from maskserve.service.registry import FillMaskService
from maskserve.service.served_model import ServedModel


@dataclass(frozen=True)
class AppliedLoad:
    """A load this worker applied through the extension: the model it brought up, and how."""

    served: weakref.ReferenceType[ServedModel]
    overrides: dict[str, Any] | None
    change: str  # the id of the change it belongs to
    fresh: bool  # no model of that name served here before it (so undoing it is an unload)


# The loads each control applied, by model name. Keyed weakly by the control: an app's state goes
# with its app. A model served now that is not the one recorded (loaded on demand, or at start)
# was loaded with its folder's own settings.
_APPLIED: weakref.WeakKeyDictionary[ModelControl, dict[str, AppliedLoad]] = weakref.WeakKeyDictionary()


def _applied(control: ModelControl) -> dict[str, AppliedLoad]:
    return _APPLIED.setdefault(control, {})


def serving_config(service: FillMaskService, control: ModelControl, name: str) -> dict[str, Any] | None:
    """The ``parameters.config`` the model ``name`` serving now was loaded with; None for its
    folder's own settings (or when it is not serving)."""
    applied = _applied(control).get(name)
    served = service.models.get(name)
    if applied is None or served is None or applied.served() is not served:
        return None
    return applied.overrides


async def load_here(
    service: FillMaskService,
    control: ModelControl,
    name: str,
    overrides: dict[str, Any] | None,
    *,
    change: str,
    actor: str,
    reason: str = "request",
) -> bool:
    """This worker's part of a load: True when it loaded the model afresh, False for a reload.
    A failed reload's error says that the old model serves here."""
    before = service.models.get(name)
    try:
        await control.load(name, overrides, reason=reason, actor=actor)
    except MaskserveError as exc:
        if before is not None and service.models.get(name) is before:
            raise reworded(exc, f"{exc.message} (the old model still serves there)") from exc
        raise
    served = service.models.get(name)
    if served is not None:
        _applied(control)[name] = AppliedLoad(weakref.ref(served), overrides, change, before is None)
    return before is None


async def unload_here(control: ModelControl, name: str, *, actor: str, reason: str = "request") -> None:
    """This worker's part of an unload."""
    await control.unload(name, reason=reason, actor=actor)
    _applied(control).pop(name, None)


async def undo_here(service: FillMaskService, control: ModelControl, name: str, change: str) -> bool:
    """Unload ``name`` if the model serving it is the one the change ``change`` loaded afresh here;
    True if it did. A later change, or a reload, is left alone."""
    applied = _applied(control).get(name)
    served = service.models.get(name)
    if applied is None or served is None or applied.served() is not served:
        return False
    if applied.change != change or not applied.fresh:
        return False
    await unload_here(control, name, actor=f"the undo of change {change} (it failed on another worker)", reason="undo")
    return True


def made(error: type[MaskserveError], message: str) -> MaskserveError:
    """An error of class ``error`` with ``message``; a failed load for a class that needs more than
    a message."""
    try:
        return error(message)
    except TypeError:
        return ModelLoadFailed(message)


def reworded(error: MaskserveError | None, message: str) -> MaskserveError:
    """An error of ``error``'s class (a failed load for None) with ``message``."""
    return made(type(error) if error is not None else ModelLoadFailed, message)
