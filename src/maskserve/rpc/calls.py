"""What every RPC goes through, as every HTTP request goes through the middleware chain: its id,
the API key, its deadline, its span, the error sanitizer, the metrics and the access line.

A call's record is the same :class:`RequestState` an HTTP request keeps, so the task path, the
metrics and the access log read it alike. Its deadline is the call's gRPC deadline when the client
set one (as ``X-Request-Timeout`` is on HTTP: it shortens, never lengthens, ``--request-timeout``).
A client that cancels its call cancels its handler: its queued rows are dropped unrun, as for an
HTTP client that leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from maskserve.errors import INTERNAL_MESSAGE, InternalError, MaskserveError, Unauthorized
from maskserve.middleware.auth import check_control_key, key_matches
from maskserve.middleware.error_sanitizer import new_request_id
from maskserve.request.access_log import write_access_line
from maskserve.request.run_task import record_error
from maskserve.request.state import RequestState
from maskserve.rpc.protocol import SERVICE
from maskserve.rpc.status import REQUEST_ID_KEY, status_code, trailers
from maskserve.service.registry import FillMaskService

log = logging.getLogger(__name__)
ACCESS_LOG = logging.getLogger("maskserve.access")
T = TypeVar("T")

# A caller's id is kept only when it is short and plain, so it cannot forge log lines (as on HTTP).
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
# What the metrics and the access line count a call cancelled by its client as (nginx's code).
CLIENT_CLOSED = 499
METHOD = "GRPC"


class CallSpans(Protocol):
    """Tracing for calls (``rpc/tracing.py``, with ``maskserve[otel]``): a span per call."""

    def span(self, method: str, metadata: Sequence[tuple[str, Any]], state: RequestState) -> Any:
        """A context manager: the call's server span, continuing its ``traceparent``."""
        ...


@dataclass
class Calls:
    """The per-call rules of one server: its service, its keys and its tracing."""

    service: FillMaskService
    keys: tuple[bytes, ...] = ()
    spans: CallSpans | None = None

    async def unary(
        self,
        method: str,
        context: Any,
        body: Callable[[RequestState], Awaitable[T]],
        *,
        public: bool = False,
        control: bool = False,
    ) -> T:
        """One unary RPC: ``body`` on the call's record; whatever it raises ends the call with the
        status it stands for (``rpc/status.py``), counted and logged. A ``control`` call needs
        the control key instead of the API key (its body checks it: :meth:`check_control`)."""
        metadata = tuple(context.invocation_metadata() or ())
        state = RequestState(id=request_id(metadata))
        result, error = await self.run(method, context, state, body, metadata, authorize=not public and not control)
        if error is not None:
            await context.abort(status_code(error), public_message(error, state), trailers(error, state.id))
        context.set_trailing_metadata(((REQUEST_ID_KEY, state.id),))
        return result  # type: ignore[return-value]  # None only with an error, and abort raised

    async def run(
        self,
        method: str,
        context: Any,
        state: RequestState,
        body: Callable[[RequestState], Awaitable[T]],
        metadata: Sequence[tuple[str, Any]],
        *,
        authorize: bool,
    ) -> tuple[T | None, MaskserveError | None]:
        """``body`` on ``state`` within the rules (the key in the call's ``metadata`` when asked to
        ``authorize``, the deadline, the span), counted and logged: its result, or the error the
        client is to get. A client's cancellation propagates."""
        started = time.perf_counter()
        status, error, result = 200, None, None
        span = self.spans.span(method, metadata, state) if self.spans is not None else contextlib.nullcontext()
        try:
            with span:
                try:
                    if authorize:
                        self.authorize(metadata)
                    state.deadline = self._deadline(context)
                    result = await body(state)
                except MaskserveError as exc:
                    error = exc
                except asyncio.CancelledError:
                    status, state.kind = CLIENT_CLOSED, "client_closed"
                    raise
                except Exception:  # anything else: logged whole here, a fixed INTERNAL to the client
                    log.exception("unexpected error [request_id=%s]", state.id)
                    error = InternalError(INTERNAL_MESSAGE)
                if error is not None:
                    record_error(state, error)
                    status = error.status
        finally:
            # Counted and logged in the loop's next turn, once grpc holds the answer to send: the
            # record is not on the call's path to its client (HTTP, too, writes its access line
            # after the response), and the latency recorded is the call's, not its record's.
            asyncio.get_running_loop().call_soon(self._observe, method, state, status, time.perf_counter() - started)
        return result, error

    def authorize(self, metadata: Sequence[tuple[str, Any]]) -> None:
        """Nothing when the server has no key or the metadata carries one; else 401's error."""
        if not self.keys:
            return
        token = bearer_token(metadata)
        if token is None:
            raise Unauthorized("this server needs an API key: send the metadata authorization: Bearer <key>")
        if not key_matches(token, self.keys):
            raise Unauthorized("the API key is not valid", invalid_token=True)

    def check_control(self, metadata: Sequence[tuple[str, Any]]) -> None:
        """The control key (``--control-key``) in the metadata, as the REST control routes ask it."""
        check_control_key(self.service.settings.control_key, bearer_token(metadata))

    def _deadline(self, context: Any) -> float:
        timeout = self.service.settings.request_timeout
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, max(remaining, 0.0))
        return asyncio.get_running_loop().time() + timeout

    def _observe(self, method: str, state: RequestState, status: int, seconds: float) -> None:
        kind = state.kind or ("ok" if status < 400 else "error")
        metrics = self.service.metrics
        metrics.observe_request(method, status, kind, seconds, state.model, protocol="grpc")
        if state.answers:
            metrics.observe_answers(state.answers, state.windows, state.model)
        write_access_line(ACCESS_LOG, state, METHOD, f"/{SERVICE}/{method}", status, seconds)


def bearer_token(metadata: Sequence[tuple[str, Any]]) -> bytes | None:
    """The token of the ``authorization: Bearer <token>`` metadata, or None."""
    given = next((str(value) for key, value in metadata if key == "authorization"), "")
    scheme, _, token = given.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token.encode("utf-8", "surrogateescape")


def public_message(error: MaskserveError, state: RequestState) -> str:
    """What the client reads: REST's message; for an unexpected failure the fixed one and the id."""
    if status_code(error) is grpc.StatusCode.INTERNAL:
        return f"{INTERNAL_MESSAGE} (request id {state.id})"
    return error.message


def request_id(metadata: Sequence[tuple[str, Any]]) -> str:
    given = next((str(value) for key, value in metadata if key == REQUEST_ID_KEY), "")
    return given if _SAFE_REQUEST_ID.fullmatch(given) else new_request_id()
