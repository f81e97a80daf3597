"""The error sanitizer: every error leaves as one JSON shape with a stable kind and a request id.

The shape is the Hugging Face Inference API's, shared by TGI and TEI, because the official clients
show its ``error`` string to their users (``huggingface_hub``, ``@huggingface/inference``) and
Open Inference Protocol clients (tritonclient, KServe) read the same key::

    {"error": "<message for people>", "error_type": "<stable kind>", "request_id": "...", <details>}

where the details are the error's own structured facts (``retry_after``, ``field``).

It sits outermost so that nothing raised by any other middleware or handler escapes it. Known
errors (:mod:`maskserve.errors`, aiohttp's HTTP exceptions) keep their status and public message;
anything else is logged with its traceback and answered with a fixed 500.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import secrets
from http import HTTPStatus
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from maskserve.errors import (
    INTERNAL_MESSAGE,
    ClientError,
    InternalError,
    MaskserveError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from maskserve.request.keys import state_of
from maskserve.request.run_task import note_error

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
# A caller's id is kept only when it is short and plain, so it cannot forge log lines.
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def error_body(error: MaskserveError, request_id: str) -> dict[str, str | int]:
    return {"error": error.message, "error_type": error.kind, "request_id": request_id, **error.details()}


def error_response(error: MaskserveError, request_id: str) -> web.Response:
    response = web.json_response(error_body(error, request_id), status=error.status, headers=error.headers())
    response.headers[REQUEST_ID_HEADER] = request_id
    return response


def raw_error_response(error: MaskserveError) -> bytes:
    """``error`` as a whole HTTP/1.1 response that closes its connection, for a connection refused
    before any request is read (so before any of the app's machinery runs)."""
    request_id = new_request_id()
    body = json.dumps(error_body(error, request_id)).encode()
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "Content-Length": str(len(body)),
        "Connection": "close",
        REQUEST_ID_HEADER: request_id,
        **error.headers(),
    }
    head = f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (head + "\r\n").encode("latin-1") + body


def _from_http_exception(exc: web.HTTPException) -> MaskserveError:
    """aiohttp's own 4xx/5xx (routing, body size) as maskserve errors; never its text."""
    if isinstance(exc, web.HTTPNotFound):
        return NotFound("no such path; POST / with a sentence to fill")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"{exc.method} is not allowed here", allowed=frozenset(exc.allowed_methods))
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge("the body is larger than this server accepts")
    if isinstance(exc, web.HTTPUnsupportedMediaType):
        return UnsupportedMediaType("this content type is not supported")
    if 400 <= exc.status < 500:
        error = ClientError(exc.reason or "bad request")
        error.status = exc.status
        return error
    return InternalError(INTERNAL_MESSAGE)


# A new request's id: this process's random prefix and a count. Unique across replicas and restarts
# as a random id would be (the prefix has 64 random bits), without a system call per request: at
# full load a uuid4 each (16 bytes from the kernel's random source) showed in the event loop's profile.
class _RequestIds:
    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.prefix = secrets.token_hex(8)
        self.count = itertools.count(1)

    def new(self) -> str:
        return f"{self.prefix}{next(self.count):016x}"


_IDS = _RequestIds()
# A worker forked by --workers' arbiter gets a prefix of its own, or two workers would count alike.
os.register_at_fork(after_in_child=_IDS.reseed)


def new_request_id() -> str:
    return _IDS.new()


def assign_request_id(request: web.Request) -> str:
    given = request.headers.get(REQUEST_ID_HEADER, "")
    request_id = given if _SAFE_REQUEST_ID.fullmatch(given) else new_request_id()
    state_of(request).id = request_id
    return request_id


def _serves_files(request: web.Request) -> bool:
    return isinstance(request.match_info.route.resource, web.StaticResource)


def _file_exists(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the filesystem, say: no such file either (found by fuzzing)
        return False


async def _is_file(response: web.FileResponse) -> bool:
    # FileResponse keeps its path only in ``_path``; stat it off the event loop, as aiohttp does.
    return await asyncio.to_thread(_file_exists, response._path)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = assign_request_id(request)
    try:
        response = await handler(request)
    except MaskserveError as exc:
        error = exc
    except web.HTTPException as exc:
        if exc.status < 400:
            exc.headers[REQUEST_ID_HEADER] = request_id
            raise
        error = _from_http_exception(exc)
    except Exception as exc:
        if isinstance(exc, OSError) and _serves_files(request):
            # aiohttp's static route resolves the name itself, and a name the filesystem refuses
            # (too long, say) raises there: it names no file we serve (found by fuzzing).
            error = NotFound("no such path; POST / with a sentence to fill")
        else:
            log.exception("unexpected error [request_id=%s]", request_id)
            error = InternalError(INTERNAL_MESSAGE)
    else:
        if isinstance(response, web.FileResponse) and not await _is_file(response):
            # aiohttp's static route finds a missing file only while sending, and then answers
            # an empty 404: catch it here so it leaves in the error shape like every other 404.
            error = NotFound("no such path; POST / with a sentence to fill")
        else:
            response.headers[REQUEST_ID_HEADER] = request_id
            return response
    note_error(request, error)
    return error_response(error, request_id)
