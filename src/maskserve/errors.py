"""The errors a client can see: each carries its HTTP status, a stable ``kind`` and a public message.

The error middleware renders every one of them in the Hugging Face Inference API's convention,
which TGI and TEI share and the official clients read (``huggingface_hub``, ``@huggingface/inference``):
``{"error": <message>, "error_type": <kind>, "request_id": ..., <details>...}``, where the details
(:meth:`MaskserveError.details`: ``retry_after``, the offending ``field``) are further top-level
keys. Anything else raised while serving becomes a fixed :class:`InternalError` and its details go
to the log only.

    MaskserveError                      500 internal
    ├── ClientError                     400 bad_request
    │   ├── InvalidBody                 400 invalid_body        (bad UTF-8, bad JSON)
    │   ├── InvalidHeader               400 invalid_header
    │   ├── Unauthorized                401 unauthorized        (with WWW-Authenticate: Bearer)
    │   ├── Forbidden                   403 forbidden           (a control route, without its key)
    │   ├── NotFound                    404 not_found
    │   │   ├── ModelNotLoaded          404 model_not_loaded    (in the repository, not serving now)
    │   │   └── ExtensionOff            404 extension_off       (model control off: none mode)
    │   ├── MethodNotAllowed            405 method_not_allowed
    │   ├── BodyTimeout                 408 body_timeout        (and the connection closed)
    │   ├── PayloadTooLarge             413 payload_too_large
    │   ├── UnsupportedMediaType        415 unsupported_media_type
    │   ├── InvalidInput                422 invalid_input       (well-formed but unusable)
    │   │   ├── NoMaskToken             422 no_mask_token
    │   │   ├── TextTooLong             422 text_too_long
    │   │   ├── TooManyMasks            422 too_many_masks
    │   │   ├── TooManyPredictions      422 too_many_predictions
    │   │   ├── ResponseTooLarge        422 response_too_large
    │   │   └── RequestTooCostly        422 request_too_costly
    │   ├── ModelConfigInvalid          400 model_config_invalid (a load's parameters.config)
    │   ├── ModelNotLoadable            409 model_not_loadable  (its folder as it stands: files missing, bad yaml)
    │   └── RateLimited                 429 rate_limited        (with Retry-After)
    ├── ServiceUnavailable              503 unavailable         (always with Retry-After)
    │   ├── Overloaded                  503 overloaded
    │   ├── ShuttingDown                503 shutting_down
    │   ├── TooManyConnections          503 too_many_connections (before the request is read)
    │   ├── ModelUnavailable            503 model_unavailable   (unloaded or swapped under an accepted request)
    │   └── LoadsPaced                  503 loads_paced         (on-demand: every model that would make room is too new)
    ├── DeadlineExceeded                504 timeout
    ├── ModelsMemoryExceeded            507 models_memory_exceeded (nothing was unloaded for it)
    ├── ModelLoadFailed                 500 model_load_failed   (the server's side: the engine, a sibling, a timeout)
    ├── InferenceFailed                 500 inference_failed
    └── InternalError                   500 internal

Why 503 and not 429 for overload: 429 tells *this* client that *it* sent too much. maskserve sheds
load when the shared queue is full, whoever filled it, so the honest signal is that the service is
temporarily unavailable, with a computed ``Retry-After`` (RFC 9110 §15.6.4). 429 stays free for
per-client rate limiting (:class:`RateLimited`, raised by the example in ``examples/ratelimit``),
so the two causes never look alike.
"""

from __future__ import annotations


def retry_after_seconds(seconds: float) -> str:
    """Whole seconds (RFC 9110 delay-seconds), rounded up; at least 1 so clients never retry in a storm."""
    return str(max(1, int(-(-seconds // 1))))


Details = dict[str, str | int]


class MaskserveError(Exception):
    """Base of every error a client may see. Never raised itself."""

    status: int = 500
    kind: str = "internal"
    # Seconds after which a retry may succeed, on the errors that say so (429, 503): sent as the
    # Retry-After header and, for clients that read only the body, as ``retry_after``.
    retry_after: float | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def headers(self) -> dict[str, str]:
        """Extra response headers this error needs."""
        return {} if self.retry_after is None else {"Retry-After": retry_after_seconds(self.retry_after)}

    def details(self) -> Details:
        """Structured facts a program can act on, sent beside the message (never internals)."""
        return {} if self.retry_after is None else {"retry_after": int(retry_after_seconds(self.retry_after))}


class ClientError(MaskserveError):
    """The request is wrong; sending it again unchanged will fail again."""

    status = 400
    kind = "bad_request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        # What in the request was wrong: a JSON path (``parameters.top_k``, ``inputs[2]``), a form
        # field or a header name. None when the message is about the request as a whole.
        self.field = field

    def details(self) -> Details:
        return {**super().details(), "field": self.field} if self.field else super().details()


class InvalidBody(ClientError):
    """The body cannot be read: invalid UTF-8, or invalid or too deeply nested JSON."""

    kind = "invalid_body"


class InvalidHeader(ClientError):
    """A header maskserve reads (e.g. ``X-Request-Timeout``) has an unusable value."""

    kind = "invalid_header"


class Unauthorized(ClientError):
    """The request lacks a valid ``Authorization: Bearer`` key (``--api-key`` is set)."""

    status = 401
    kind = "unauthorized"

    def __init__(self, message: str, *, invalid_token: bool = False) -> None:
        super().__init__(message)
        self.invalid_token = invalid_token

    def headers(self) -> dict[str, str]:
        # RFC 6750 §3: a wrong key says so; a missing one only names the scheme.
        challenge = 'Bearer realm="maskserve"'
        return {"WWW-Authenticate": challenge + (', error="invalid_token"' if self.invalid_token else "")}


class Forbidden(ClientError):
    """A model control route (load, unload) without the control key, or with control turned off:
    the API key does not grant it."""

    status = 403
    kind = "forbidden"


class NotFound(ClientError):
    """No route matches the path, or no model of that name is served."""

    status = 404
    kind = "not_found"


class ModelNotLoaded(NotFound):
    """The model is in the repository but not serving now (never loaded, unloaded, or evicted):
    the message says which, and how to load it."""

    kind = "model_not_loaded"


class ExtensionOff(NotFound):
    """A route of the model repository extension on a server whose models are fixed at start
    (``--model-control-mode none``): answered as a server without the extension would."""

    kind = "extension_off"


class ModelConfigInvalid(ClientError):
    """A load's own settings (``parameters.config``) are not a model's settings: the client's
    mistake, refused before anything is loaded or unloaded; a model that served before still serves."""

    kind = "model_config_invalid"


class ModelNotLoadable(ClientError):
    """The model's folder cannot be loaded as it stands (weights or tokenizer files missing, as
    while it is still being copied; a ``maskserve.yaml`` that is not a model's settings). Refused
    before anything is evicted; the message names what is missing."""

    status = 409
    kind = "model_not_loadable"


class ModelLoadFailed(MaskserveError):
    """A load or reload failed on the server's side (the engine refused the files, the load outlasted
    ``--model-load-timeout``, a sibling worker did not answer); a model that served before still
    serves. The message gives the reason, as the repository index does; the log has the details."""

    kind = "model_load_failed"


class ModelsMemoryExceeded(MaskserveError):
    """A load would pass ``--models-memory`` even after unloading every idle model: nothing was
    unloaded for it, and the serving models are untouched."""

    status = 507
    kind = "models_memory_exceeded"


class MethodNotAllowed(ClientError):
    """The path exists but not for this method."""

    status = 405
    kind = "method_not_allowed"

    def __init__(self, message: str, allowed: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.allowed = allowed

    def headers(self) -> dict[str, str]:
        return {"Allow": ", ".join(sorted(self.allowed))} if self.allowed else {}


class PayloadTooLarge(ClientError):
    """The body is larger than ``--max-body-bytes``."""

    status = 413
    kind = "payload_too_large"


class UnsupportedMediaType(ClientError):
    """The content type is one maskserve cannot read."""

    status = 415
    kind = "unsupported_media_type"


class InvalidInput(ClientError):
    """The request is well-formed but a value is out of range (top_k, targets, empty text...)."""

    status = 422
    kind = "invalid_input"


class NoMaskToken(InvalidInput):
    """A text holds no mask token; the message names the model's own (``[MASK]`` or ``<mask>``)."""

    kind = "no_mask_token"


class TextTooLong(InvalidInput):
    """A text is longer than ``--max-text-chars`` or ``--max-text-tokens``, has more tokens to score than
    ``--max-score-tokens``, or is longer than the model reads when the request asked not to read it in
    windows (``parameters.long_text: "refuse"``)."""

    kind = "text_too_long"


class TooManyMasks(InvalidInput):
    """A text holds more mask tokens than ``--max-masks-per-text``."""

    kind = "too_many_masks"


class TooManyPredictions(InvalidInput):
    """Texts x masks x top_k is more than ``--max-predictions``."""

    kind = "too_many_predictions"


class ResponseTooLarge(InvalidInput):
    """The answer could be larger than ``--max-response-bytes``: known from the texts before any work."""

    kind = "response_too_large"


class RequestTooCostly(InvalidInput):
    """Even with nothing else queued, the request would take longer than this server's request
    timeout (``--request-timeout``), by its measured costs: as sent, it can never be answered."""

    kind = "request_too_costly"


class BodyTimeout(ClientError):
    """The request's body did not arrive within ``--body-timeout`` of its headers; the connection
    is closed after this answer."""

    status = 408
    kind = "body_timeout"


class RateLimited(ClientError):
    """This client sent more than its share; retrying after ``Retry-After`` may succeed."""

    status = 429
    kind = "rate_limited"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ServiceUnavailable(MaskserveError):
    """The server cannot take this request now; retrying after ``Retry-After`` may succeed."""

    status = 503
    kind = "unavailable"
    reason = "unavailable"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Overloaded(ServiceUnavailable):
    """The queue is full, or the predicted wait already exceeds the request's deadline."""

    kind = "overloaded"

    def __init__(self, message: str, retry_after: float = 1.0, *, reason: str = "queue_full") -> None:
        super().__init__(message, retry_after)
        # Why the door closed, for counters and traces: queue_full or predicted_timeout.
        self.reason = reason


class ShuttingDown(ServiceUnavailable):
    """The server is draining after SIGTERM/SIGINT and accepts no new work."""

    kind = "shutting_down"
    reason = "shutting_down"


class TooManyConnections(ServiceUnavailable):
    """``--max-connections`` client connections are open: a new one is answered this, without its
    request being read, and closed."""

    kind = "too_many_connections"
    reason = "connection_limit"


class ModelUnavailable(ServiceUnavailable):
    """The model this request was accepted for was unloaded (or swapped by a reload) before it ran:
    a retry finds it again, or its replacement, or an on-demand load."""

    kind = "model_unavailable"
    reason = "model_unavailable"


class LoadsPaced(ServiceUnavailable):
    """On-demand control: this model could load only by evicting a model loaded on demand less than
    ``--model-min-residency`` ago. Refused rather than thrashing; ``Retry-After`` says when one may go."""

    kind = "loads_paced"
    reason = "loads_paced"


class DeadlineExceeded(MaskserveError):
    """The request's deadline passed before its answer was ready."""

    status = 504
    kind = "timeout"


class InferenceFailed(MaskserveError):
    """The model raised on this input alone (its batch neighbours were answered)."""

    kind = "inference_failed"


class InternalError(MaskserveError):
    """Anything unexpected; the details are logged with the request id, never sent."""

    kind = "internal"


INTERNAL_MESSAGE = "internal server error; the request id identifies it in the server log"


def errors_by_kind() -> dict[str, type[MaskserveError]]:
    """Every error class by the ``kind`` it carries (a kind two classes share: the subclass's),
    walked from the tree so that none is forgotten."""
    kinds: dict[str, type[MaskserveError]] = {}
    pending: list[type[MaskserveError]] = [MaskserveError]
    while pending:
        cls = pending.pop(0)
        kinds[cls.kind] = cls
        pending.extend(cls.__subclasses__())
    return kinds
