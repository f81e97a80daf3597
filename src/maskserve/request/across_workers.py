"""A model repository change on every worker (``--workers``), and one index from all of them.

Every worker is a whole maskserve with its own models, so a load or unload asked of one is applied
by all of them, and the index any of them answers is the whole server's. Workers reach each other
over their private sockets (the same ones ``/metrics`` gathers the server's series through): Unix
sockets in a directory only this server's processes can open. A request forwarded to a sibling
carries :data:`PEER_HEADER` (applied there, and no further), :data:`ACTOR_HEADER` (who asked, for
its log) and :data:`CHANGE_HEADER` (the change's id, by which it is undone). These headers are
honoured only on a request that came over a private socket (:func:`from_sibling`); from a public
client they are ignored, and its request is an ordinary one: applied everywhere, logged with the
client's own address.

A load that fails on any worker is undone where it loaded afresh (a reload cannot be undone: the
answer says which worker serves which model). A worker that starts late, or that gunicorn starts
in place of a dead one, loads what its siblings serve before it takes connections
(:func:`join_siblings`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import hdrs, web

from maskserve.errors import MaskserveError, ModelLoadFailed, errors_by_kind
from maskserve.observability.peers import Peers
from maskserve.request.model_repository import entry_json
from maskserve.request.worker_loads import load_here, made, reworded, serving_config, undo_here, unload_here
from maskserve.service.model_control import ModelControl
from maskserve.service.registry import FillMaskService

log = logging.getLogger("maskserve.models")

PEER_HEADER = "X-Maskserve-Peer"
# Who asked the worker that forwards a change, for the siblings' logs.
ACTOR_HEADER = "X-Maskserve-Actor"
# The id of the change a forwarded load belongs to: the asking request's id.
CHANGE_HEADER = "X-Maskserve-Change"
# On a forwarded unload: undo the change of this id, where it loaded its model afresh, and nothing else.
UNDO_HEADER = "X-Maskserve-Undo"
INDEX_PATH = "/v2/repository/index"
# On a sibling's own index entry (never in a public answer): the load's parameters.config of the
# model it serves, so that a worker joining late loads it as its siblings did.
LOAD_CONFIG_KEY = "load_config"


def from_sibling(request: web.BaseRequest) -> bool:
    """Whether ``request`` came over a worker's private socket. Every public listener is TCP (the
    port, or the process manager's sockets on it); the private ones are Unix sockets in a
    directory only this server's user can open. The transport decides, never a header."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock is not None and sock.family == socket.AF_UNIX


def forwarded(request: web.BaseRequest) -> bool:
    """A change or an index a sibling worker forwarded: the peer header, on a private socket."""
    return PEER_HEADER in request.headers and from_sibling(request)


def change_path(name: str, action: str) -> str:
    """The REST route of a load or unload of ``name``, for a sibling: the name quoted as one segment."""
    return f"/v2/repository/models/{quote(name, safe='')}/{action}"


# -- a change on every worker ---------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One worker's part of a change: its error, or whether it loaded the model afresh."""

    worker: str
    error: MaskserveError | None = None
    fresh: bool = False


def _by_worker(worker: str) -> tuple[int, str]:
    return (len(worker), worker)  # slots are numbers: "10" after "9"


async def load_everywhere(
    service: FillMaskService,
    control: ModelControl,
    name: str,
    overrides: dict[str, Any] | None,
    *,
    body: bytes,
    authorization: str | None,
    actor: str,
    change: str,
) -> None:
    """Load ``name`` here and, with workers, on every sibling at once (``body``: the REST route's,
    forwarded). If it fails on some workers, it is undone where it loaded afresh, and the error
    (the first failure's kind) says what each worker did."""
    here = load_here(service, control, name, overrides, change=change, actor=actor)
    peers = service.peers
    if peers is None:
        await here
        return
    headers = _sibling_headers(authorization, actor, change)
    outcomes = await _gather(peers, here, peers.forward(change_path(name, "load"), body, headers))
    failed = [outcome for outcome in outcomes if outcome.error is not None]
    if not failed:
        return
    if len(failed) == len(outcomes):
        raise _first_error(peers, outcomes)
    undone = await _undo(service, control, peers, name, change, headers, [o.worker for o in outcomes if o.fresh])
    parts = []
    for outcome in outcomes:
        if outcome.error is not None:
            parts.append(f"worker {outcome.worker}: {outcome.error.message}")
        elif outcome.fresh:
            why = undone.get(outcome.worker)
            parts.append(
                f"loaded on worker {outcome.worker} " + ("and undone" if why is None else f"(its undo failed: {why})")
            )
        else:
            parts.append(f"reloaded on worker {outcome.worker}")
    raise reworded(failed[0].error, f"model {name!r} was not loaded on every worker: " + "; ".join(parts))


async def unload_everywhere(
    service: FillMaskService, control: ModelControl, name: str, *, authorization: str | None, actor: str, change: str
) -> None:
    """Unload ``name`` here and, with workers, on every sibling at once. An unload is not undone:
    if it fails on some workers, the error says which still serve it."""
    here = unload_here(control, name, actor=actor)
    peers = service.peers
    if peers is None:
        await here
        return
    headers = _sibling_headers(authorization, actor, change)
    outcomes = await _gather(peers, here, peers.forward(change_path(name, "unload"), b"{}", headers))
    failed = [outcome for outcome in outcomes if outcome.error is not None]
    if not failed:
        return
    if len(failed) == len(outcomes):
        raise _first_error(peers, outcomes)
    parts = [
        f"unloaded on worker {o.worker}" if o.error is None else f"worker {o.worker}: {o.error.message}"
        for o in outcomes
    ]
    raise reworded(failed[0].error, f"model {name!r} was not unloaded on every worker: " + "; ".join(parts))


async def _gather(
    peers: Peers, here: Awaitable[bool | None], siblings: Awaitable[list[tuple[str, int, bytes]]]
) -> list[Outcome]:
    """This worker's part and the siblings' answers, as one outcome per worker, by slot."""
    mine, answers = await asyncio.gather(here, siblings, return_exceptions=True)
    if isinstance(answers, BaseException):
        raise answers  # forward answers a sibling's failure as its status: anything else is a bug
    if isinstance(mine, BaseException) and not isinstance(mine, MaskserveError):
        raise mine
    outcomes = [
        Outcome(peers.worker, error=mine)
        if isinstance(mine, MaskserveError)
        else Outcome(peers.worker, fresh=bool(mine))
    ]
    for slot, status, reply in answers:
        if status != 200:
            outcomes.append(Outcome(slot, error=peer_failure(status, reply)))
        else:
            outcomes.append(Outcome(slot, fresh=_answered_fresh(reply)))
    return sorted(outcomes, key=lambda outcome: _by_worker(outcome.worker))


def _answered_fresh(reply: bytes) -> bool:
    """A sibling's answer to a forwarded load: ``{"fresh": true}`` when it loaded the model afresh."""
    try:
        return json.loads(reply).get("fresh") is True
    except (ValueError, AttributeError):
        return False


def _first_error(peers: Peers, outcomes: list[Outcome]) -> MaskserveError:
    """A change that failed on every worker: this worker's error, as a single process answers it."""
    mine = next(outcome for outcome in outcomes if outcome.worker == peers.worker)
    assert mine.error is not None
    return mine.error


async def _undo(
    service: FillMaskService,
    control: ModelControl,
    peers: Peers,
    name: str,
    change: str,
    headers: dict[str, str],
    workers: list[str],
) -> dict[str, str | None]:
    """Undo ``change`` on ``workers`` (where it loaded ``name`` afresh): None for each worker where
    it is undone, else why not."""
    undone: dict[str, str | None] = {}
    if peers.worker in workers:
        try:
            done = await undo_here(service, control, name, change)
            undone[peers.worker] = None if done else "a later change holds the model there"
        except MaskserveError as exc:
            undone[peers.worker] = exc.message
    if any(worker != peers.worker for worker in workers):
        # Every sibling is asked; each undoes only what this change loaded afresh there.
        answers = await peers.forward(change_path(name, "unload"), b"{}", headers | {UNDO_HEADER: change})
        for slot, status, reply in answers:
            if slot in workers:
                undone[slot] = None if status == 200 else peer_failure(status, reply).message
    for worker, why in undone.items():
        if why is not None:
            log.error("model %r: the undo of change %s on worker %s failed: %s", name, change, worker, why)
    return undone


def _sibling_headers(authorization: str | None, actor: str, change: str) -> dict[str, str]:
    headers = {PEER_HEADER: "1", ACTOR_HEADER: actor, CHANGE_HEADER: change, hdrs.CONTENT_TYPE: "application/json"}
    if authorization is not None:
        headers[hdrs.AUTHORIZATION] = authorization
    return headers


# -- the index ------------------------------------------------------------------------------------


def own_index(service: FillMaskService, control: ModelControl, ready: bool) -> list[dict[str, Any]]:
    """This worker's index for a sibling: each model serving with the load config it was loaded with."""
    entries = [entry_json(entry) for entry in control.index(ready_only=ready)]
    for entry in entries:
        if entry["state"] == "READY" and (config := serving_config(service, control, entry["name"])) is not None:
            entry[LOAD_CONFIG_KEY] = config
    return entries


async def merged_index(peers: Peers, entries: list[dict[str, Any]], ready: bool) -> list[dict[str, Any]]:
    """This worker's index entries merged with every sibling's: a model is in a state with one
    reason when every worker holds it so; otherwise each worker's state is in the reason."""
    headers = {PEER_HEADER: "1", hdrs.CONTENT_TYPE: "application/json"}
    answers = await peers.forward(INDEX_PATH, json.dumps({"ready": ready}).encode(), headers)
    workers: dict[str, dict[str, dict[str, Any]]] = {peers.worker: {entry["name"]: entry for entry in entries}}
    for slot, status, body in answers:
        # A worker that did not answer holds every model in an unknown state (the reason says so).
        workers[slot] = {entry["name"]: entry for entry in _index_of(status, body) or ()}
    names = sorted({name for held in workers.values() for name in held})
    merged = []
    for name in names:
        found = {slot: held.get(name) for slot, held in sorted(workers.items(), key=lambda item: _by_worker(item[0]))}
        present = [entry for entry in found.values() if entry is not None]
        if ready and len(present) < len(found):
            continue  # ready on some workers only: not ready as a server
        states = {entry["state"] for entry in present}
        reasons = {entry.get("reason", "") for entry in present}
        entry = {key: value for key, value in present[0].items() if key != LOAD_CONFIG_KEY}
        if len(states) > 1 or len(reasons) > 1 or len(present) < len(found):
            # Workers that disagree (a reload that failed on one of them, a worker that did not
            # answer): each worker's state and reason.
            entry["state"] = next((e["state"] for e in present if e["state"] != "READY"), "READY")
            if len(present) < len(found) and entry["state"] == "READY":
                entry["state"] = "UNAVAILABLE"
            entry["reason"] = "; ".join(f"worker {slot}: {_described(e)}" for slot, e in found.items())
        merged.append(entry)
    return merged


def _index_of(status: int, body: bytes) -> list[dict[str, Any]] | None:
    """A sibling's own index entries; None when it did not give them."""
    if status != 200:
        return None
    try:
        entries = json.loads(body)
    except ValueError:
        return None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "name" in e and "state" in e for e in entries):
        return None
    return entries


def _described(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "unknown (no answer)"
    return str(entry["state"]) + (f" ({entry['reason']})" if entry.get("reason") else "")


# -- a worker joining its siblings ----------------------------------------------------------------


@dataclass(frozen=True)
class SiblingsHold:
    """What the siblings serve: each model ready on any of them, with its load config (the lowest
    slot's), and the models none of them serves."""

    ready: dict[str, dict[str, Any] | None]
    unloaded: set[str]


async def held_by_siblings(peers: Peers) -> SiblingsHold | None:
    """What the live siblings serve, from their own indexes; None when none answers (this worker is
    the first up, or alone)."""
    headers = {PEER_HEADER: "1", hdrs.CONTENT_TYPE: "application/json"}
    answers = await peers.forward(INDEX_PATH, b'{"ready": false}', headers)
    answered = (_index_of(status, body) for _, status, body in sorted(answers, key=lambda a: _by_worker(a[0])))
    indexes = [entries for entries in answered if entries is not None]
    if not indexes:
        return None
    ready: dict[str, dict[str, Any] | None] = {}
    listed: set[str] = set()
    for entries in indexes:
        for entry in entries:
            listed.add(entry["name"])
            if entry["state"] == "READY":
                ready.setdefault(entry["name"], entry.get(LOAD_CONFIG_KEY))
    return SiblingsHold(ready, listed - set(ready))


async def join_siblings(service: FillMaskService) -> None:
    """Serve what the siblings serve (each model with their load config), and not what none of
    them serves: a worker starting late, or in place of a dead one, would otherwise hold only the
    models named at start. A model that cannot be loaded here is logged and left out (the index
    shows the workers disagreeing)."""
    control, peers = service.control, service.peers
    if control is None or not control.allows_changes or peers is None:
        return
    held = await held_by_siblings(peers)
    if held is None:
        return
    actor = f"worker {peers.worker}'s start (its siblings serve it)"
    for name, overrides in sorted(held.ready.items()):
        served = service.models.get(name)
        if served is not None and serving_config(service, control, name) == overrides:
            continue
        if not control.knows(name):
            log.warning("worker %s cannot serve %r as its siblings do: it is no model here", peers.worker, name)
            continue
        try:
            await load_here(
                service, control, name, overrides, change=f"start-{peers.worker}", actor=actor, reason="join"
            )
        except MaskserveError as exc:
            log.warning("worker %s could not load %r as its siblings serve it: %s", peers.worker, name, exc.message)
    for name in sorted(held.unloaded):
        if name in service.models:
            await unload_here(
                control, name, actor=f"worker {peers.worker}'s start (no sibling serves it)", reason="join"
            )


# -- a sibling's answer ---------------------------------------------------------------------------


def peer_failure(status: int, body: bytes) -> MaskserveError:
    """A sibling's refusal as an error of the same kind (and so the same status). A sibling that did
    not answer fails the change as a load that failed: the caller may retry it, and the index says
    where each worker stands."""
    try:
        answer = json.loads(body)
        message, kind = str(answer["error"]), str(answer["error_type"])
    except (ValueError, KeyError, TypeError):
        message, kind = f"answered {status or 'nothing'}", ModelLoadFailed.kind
    return made(_ERROR_KINDS.get(kind, ModelLoadFailed), message)


# Every error class by its kind, for a sibling's refusals.
_ERROR_KINDS = errors_by_kind()
