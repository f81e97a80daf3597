"""What the model repository extension's REST routes (``api/repository.py``) and RPCs
(``rpc/servicer.py``) share: the control when it is on, a load's settings, the index's entries,
and the server across ``--workers``.

Every worker is a whole maskserve with its own models, so a load or unload asked of one is applied
by all of them, and the index any of them answers is the whole server's. Workers reach each other
over their private sockets (the same ones ``/metrics`` gathers the server's series through); a
request forwarded to a sibling carries :data:`PEER_HEADER`, so it is applied there and goes no
further.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs

from maskserve.config.model_repository import config_overrides
from maskserve.config.settings import NamedSettingsError
from maskserve.errors import (
    ExtensionOff,
    InvalidInput,
    MaskserveError,
    ModelConfigInvalid,
    ModelLoadFailed,
    errors_by_kind,
)
from maskserve.observability.metrics import Peers
from maskserve.service.model_catalog import IndexEntry
from maskserve.service.model_control import ModelControl
from maskserve.service.registry import FillMaskService

PEER_HEADER = "X-Maskserve-Peer"
# Who asked the worker that forwards a change, for the siblings' logs.
ACTOR_HEADER = "X-Maskserve-Actor"


def control_of(service: FillMaskService) -> ModelControl:
    """The model control, when the extension is on; a 404 as on a server without it otherwise."""
    control = service.control
    if control is None or not control.allows_changes:
        raise ExtensionOff("the model repository extension is off here (--model-control-mode none)")
    return control


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


async def everywhere(
    service: FillMaskService,
    path: str,
    body: bytes,
    authorization: str | None,
    here: Callable[[], Awaitable[None]],
    *,
    actor: str,
    forwarded: bool = False,
) -> None:
    """Run ``here`` (this worker's part of a load or unload) and, with workers, the same request
    (``POST path`` with ``body``, the REST route's) on every sibling at once, unless it was
    ``forwarded`` by one; raise this worker's error, else the first sibling's, naming it."""
    peers = service.peers
    if peers is None or forwarded:
        await here()
        return
    headers = {PEER_HEADER: "1", ACTOR_HEADER: actor, hdrs.CONTENT_TYPE: "application/json"}
    if authorization is not None:
        headers[hdrs.AUTHORIZATION] = authorization
    local, answers = await asyncio.gather(here(), peers.forward(path, body, headers), return_exceptions=True)
    if isinstance(local, BaseException):
        raise local
    if isinstance(answers, BaseException):
        raise answers
    for slot, status, reply in answers:
        if status != 200:
            raise peer_error(slot, status, reply)


async def merged_index(peers: Peers, entries: list[dict[str, Any]], ready: bool) -> list[dict[str, Any]]:
    """This worker's index entries merged with every sibling's: a model is in a state when every
    worker holds it in that state; otherwise each worker's state is in the reason."""
    headers = {PEER_HEADER: "1", hdrs.CONTENT_TYPE: "application/json"}
    answers = await peers.forward("/v2/repository/index", json.dumps({"ready": ready}).encode(), headers)
    workers: dict[str, dict[str, dict[str, Any]]] = {peers.worker: {entry["name"]: entry for entry in entries}}
    for slot, status, body in answers:
        # A worker that did not answer holds every model in an unknown state (the reason says so).
        workers[slot] = {entry["name"]: entry for entry in json.loads(body)} if status == 200 else {}
    names = sorted({name for held in workers.values() for name in held})
    merged = []
    for name in names:
        found = {slot: held.get(name) for slot, held in sorted(workers.items())}
        present = [entry for entry in found.values() if entry is not None]
        if ready and len(present) < len(found):
            continue  # ready on some workers only: not ready as a server
        states = {entry["state"] for entry in present}
        entry = dict(present[0])
        if len(states) > 1 or len(present) < len(found):
            entry["state"] = next((e["state"] for e in present if e["state"] != "READY"), "UNAVAILABLE")
            entry["reason"] = "; ".join(f"worker {slot}: {_described(e)}" for slot, e in found.items())
        merged.append(entry)
    return merged


def _described(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "unknown (no answer)"
    return str(entry["state"]) + (f" ({entry['reason']})" if entry.get("reason") else "")


def peer_error(slot: str, status: int, body: bytes) -> MaskserveError:
    """A sibling's refusal as this worker's own error: the same kind (and so the same status),
    its message naming the worker. A sibling that did not answer fails the change as a load that
    failed: the caller may retry it, and the index says where each worker stands."""
    try:
        answer = json.loads(body)
        message, kind = str(answer["error"]), str(answer["error_type"])
    except (ValueError, KeyError, TypeError):
        message, kind = f"answered {status or 'nothing'}", ModelLoadFailed.kind
    error = _ERROR_KINDS.get(kind, ModelLoadFailed)
    try:
        return error(f"worker {slot}: {message}")
    except TypeError:  # an error that needs more than a message: the failure, as a failed load
        return ModelLoadFailed(f"worker {slot}: {message}")


# Every error class by its kind, for a sibling's refusals.
_ERROR_KINDS = errors_by_kind()
