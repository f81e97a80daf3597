"""What the handlers (the API, the demo page, the Open Inference Protocol) and the stages share:
admission at the door, the one path from a surface's input to a task's answer (:func:`run_task`),
the timing headers, and the bookkeeping of an error answered. Each rule lives here once, and
every caller uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.errors
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from aiohttp import web
from aiohttp.web_request import FileField
from multidict import MultiDictProxy

from maskserve.errors import BodyTimeout, InvalidHeader, MaskserveError, ModelUnavailable, NotFound
from maskserve.request.deadlines import request_deadline
from maskserve.request.keys import service_of, state_of
from maskserve.request.state import RequestState
from maskserve.service.served_model import ServedModel
from maskserve.serving.costs import NO_WORK
from maskserve.serving.work_queue import Answer, slowest
from maskserve.tasks.task import AnswerT, PlanT, Ran, RequestT, Rounds, Task

log = logging.getLogger(__name__)
T = TypeVar("T")


# The route table's names for the path segment that names a model: /models/{name}/... (maskserve's
# own) and /v2/models/{model}/... (the Open Inference Protocol's).
MODEL_SEGMENTS = ("name", "model")


def served_model(request: web.Request, name: str | None = None) -> ServedModel:
    """The model the request is for: ``name``, else the one its path names, else the default.
    An unknown name is a 404 that lists the served models. Resolved once and kept on the request's
    record, so the door and the handler (and the metrics) see the same one."""
    state = state_of(request)
    if name is None:
        if state.served is not None:
            return state.served
        name = next((request.match_info[key] for key in MODEL_SEGMENTS if key in request.match_info), None)
    served = service_of(request.app).served(name)
    state.served, state.model = served, served.name
    return served


async def model_for_work(request: web.Request) -> ServedModel:
    """:func:`served_model` for a request that queues work: with on-demand control, a model of the
    repository that is not loaded is loaded first, within the request's deadline."""
    state = state_of(request)
    if state.served is not None:
        return state.served
    name = next((request.match_info[key] for key in MODEL_SEGMENTS if key in request.match_info), None)
    control = service_of(request.app).control
    if control is not None:
        await control.load_on_demand(name, request_deadline(request))
    return served_model(request, name)


@contextlib.asynccontextmanager
async def held_model(state: RequestState, resolve: Callable[[], Awaitable[ServedModel]]) -> AsyncIterator[ServedModel]:
    """The model ``resolve`` finds, held (``in_use``) from here until the block ends: every route
    that queues work holds its model before it reads a byte of its body, so an unload waits for
    it and a reload swaps the new model in without failing it.

    A model released between its resolution and this hold (a reload's old model, when ``resolve``
    found it earlier) is resolved once more by its name, and the reload's new model serves the
    request. If none serves now, the request is refused as the model left under it: 503 with
    Retry-After, which retry policies retry (a 404 they would not)."""
    served = await resolve()
    with contextlib.ExitStack() as hold:
        try:
            hold.enter_context(served.in_use())
        except ModelUnavailable as released:
            state.served = None
            try:
                served = await resolve()
            except NotFound:
                raise released from None
            hold.enter_context(served.in_use())  # released again: its 503 stands
        state.held = served
        try:
            yield served
        finally:
            state.held = None


def held_for_work(request: web.Request) -> contextlib.AbstractAsyncContextManager[ServedModel]:
    """:func:`held_model` for an HTTP request that queues work (:func:`model_for_work`)."""
    return held_model(state_of(request), lambda: model_for_work(request))


def admit_at_door(request: web.Request, served: ServedModel | None = None) -> None:
    """Admission before the body is read; the deadline is fixed here, so reading the body counts."""
    (served or served_model(request)).at_door(request_deadline(request))


async def read_body(request: web.Request) -> bytes:
    """The request's body, if it arrives within ``--body-timeout`` of the headers (see :func:`_received`)."""
    return await _received(request, request.read())


async def read_form(request: web.Request) -> MultiDictProxy[str | bytes | bytearray | FileField]:
    """The request's form, if it arrives within ``--body-timeout`` of the headers."""
    return await _received(request, request.post())


async def _received(request: web.Request, reading: Awaitable[T]) -> T:
    """``reading`` if done within ``--body-timeout``; else 408, and the connection closes after
    that answer: a client this slow holds a socket, a task and a part of a body."""
    seconds = service_of(request.app).settings.body_timeout
    try:
        async with asyncio.timeout(seconds):
            return await reading
    except TimeoutError:
        state_of(request).close_after = "body_timeout"
        raise BodyTimeout(f"the request's body did not arrive within {seconds:g}s of its headers") from None


def request_media_type(request: web.Request) -> str:
    """The body's media type from ``Content-Type`` (``application/octet-stream`` when absent).

    aiohttp parses the header with the standard library's email parser, which raises assorted
    exceptions (IndexError, HeaderParseError) on some malformed values: that is the client's
    mistake, a 400 naming the header, never a 500 (found by fuzzing).
    """
    try:
        return request.content_type
    except (IndexError, ValueError, email.errors.MessageError):
        raise InvalidHeader("the Content-Type header cannot be parsed", field="Content-Type") from None


async def run_task(
    request: web.Request,
    served: ServedModel,
    task: Task[RequestT, PlanT, AnswerT],
    read: Callable[[], Awaitable[RequestT]],
) -> Ran[RequestT, AnswerT]:
    """:func:`run_recorded` for an HTTP request: its record, with its deadline fixed."""
    request_deadline(request)
    return await run_recorded(state_of(request), served, task, read)


async def run_recorded(
    state: RequestState,
    served: ServedModel,
    task: Task[RequestT, PlanT, AnswerT],
    read: Callable[[], Awaitable[RequestT]],
) -> Ran[RequestT, AnswerT]:
    """Any task for any surface and protocol, one way: ``read`` (the surface's own reading of its
    input into the task's request), the task's plan (tokenized off the event loop when long),
    admission on the plan's whole cost by the record's deadline, the queue, and the rows' answers
    folded back (off the loop when long). What the metrics need is kept on the record.

    Reading and planning are the request's ``maskserve.parse`` step: the surface's mistakes and the
    texts' are found there, before any work is queued. The routes hold ``served`` from before
    their body (:func:`held_model`); a caller that read first (a page's form) is held from here."""
    with contextlib.nullcontext() if state.held is served else served.in_use():
        with state.trace.step("maskserve.parse"):
            asked = await read()
            plan = await served.plan(task, asked)
        if state.deadline is None:
            raise RuntimeError("a request runs only once its deadline is fixed; this is a bug")
        rounds: Rounds | None = plan if isinstance(plan, Rounds) else None
        # A plan in rounds is admitted once, on what all its rounds can cost; its later rounds
        # queue with no second admission, so none is refused half-way through its work.
        cost = rounds.bound if rounds is not None else None
        rows = state.answers = await served.answer(plan.queries, state.deadline, state.trace, cost=cost)
        if rounds is not None:
            every = list(rows)
            while following := rounds.next_round(rows):
                rows = await served.answer(following, state.deadline, state.trace, cost=NO_WORK)
                every.extend(rows)
            rows = state.answers = every
        state.windows = plan.windows
        return Ran(asked, await served.fold(task, plan, rows), rows, plan.windows)


def timing_headers(answers: Sequence[Answer]) -> dict[str, str]:
    """How the request was served; with several texts, the slowest text's figures."""
    timing = slowest(answers)
    return {
        "X-Queue-Time-Ms": f"{timing.queued_s * 1000:.2f}",
        "X-Inference-Time-Ms": f"{timing.inference_s * 1000:.2f}",
        "X-Batch-Size": str(timing.batch_size),
    }


def windows_header(windows: Sequence[int]) -> dict[str, str]:
    """How many windows each text was read in, in request order (1: read whole): a header, for
    the answers whose JSON shape the clients fix (the Inference API's)."""
    return {"X-Text-Windows": ", ".join(str(count) for count in windows)}


def note_error(request: web.Request, error: MaskserveError) -> None:
    """Record what a request was answered with (:func:`record_error`). Called by the error stage,
    and by the demo page for the errors it shows."""
    record_error(state_of(request), error)


def record_error(state: RequestState, error: MaskserveError) -> None:
    """Record what a request was answered with; a server-side failure is logged (never its
    client's mistakes). Every protocol's error path calls this."""
    state.kind, state.error = error.kind, error
    if error.status >= 500 and error.kind != "internal":  # internal ones are logged with their traceback
        log.warning("%s: %s [request_id=%s]", error.kind, error.message, state.id)
