"""maskserve's errors as gRPC statuses: each with the message REST gives, and the same facts as
trailing metadata (the request id, the error's kind and field, and for load shed the wait before a
retry, in gRPC's own ``grpc-retry-pushback-ms``).

    InvalidInput and every other ClientError   INVALID_ARGUMENT   (RequestTooCostly too: see below)
    Unauthorized                               UNAUTHENTICATED
    Forbidden                                  PERMISSION_DENIED  (a control call without its key)
    NotFound                                   NOT_FOUND          (an unknown model or version)
    ModelNotLoadable                           FAILED_PRECONDITION (its folder, as it stands)
    ExtensionOff                               UNIMPLEMENTED      (the repository RPCs, control off)
    PayloadTooLarge, RateLimited               RESOURCE_EXHAUSTED
    ModelsMemoryExceeded                       RESOURCE_EXHAUSTED (a load beyond --models-memory)
    ServiceUnavailable (overloaded, draining,  UNAVAILABLE        with grpc-retry-pushback-ms
      a model gone under the call, paced loads)
    ModelLoadFailed (the server's side)        INTERNAL           with the load's reason
    DeadlineExceeded                           DEADLINE_EXCEEDED
    anything else                              INTERNAL           the fixed message and the request id

A request refused before any work because it costs more than any deadline this server allows
(``request_too_costly``) is INVALID_ARGUMENT, not RESOURCE_EXHAUSTED: sent again unchanged it fails
again, and RESOURCE_EXHAUSTED is the status gRPC clients' retry policies treat as passing.
"""

from __future__ import annotations

import math

import grpc

from maskserve.errors import (
    ClientError,
    DeadlineExceeded,
    ExtensionOff,
    Forbidden,
    MaskserveError,
    ModelNotLoadable,
    ModelsMemoryExceeded,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
)

REQUEST_ID_KEY = "x-request-id"
# gRPC's Retry-After: a client with a retry policy waits this many milliseconds before retrying.
PUSHBACK_KEY = "grpc-retry-pushback-ms"
ERROR_TYPE_KEY = "x-error-type"
ERROR_FIELD_KEY = "x-error-field"

Metadata = tuple[tuple[str, str], ...]


def status_code(error: MaskserveError) -> grpc.StatusCode:
    """The gRPC status that says what ``error`` says over HTTP (the module's table)."""
    for kind, code in (
        (Unauthorized, grpc.StatusCode.UNAUTHENTICATED),
        (Forbidden, grpc.StatusCode.PERMISSION_DENIED),
        (ExtensionOff, grpc.StatusCode.UNIMPLEMENTED),
        (ModelsMemoryExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (NotFound, grpc.StatusCode.NOT_FOUND),
        (ModelNotLoadable, grpc.StatusCode.FAILED_PRECONDITION),
        (PayloadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (RateLimited, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (ClientError, grpc.StatusCode.INVALID_ARGUMENT),
        (ServiceUnavailable, grpc.StatusCode.UNAVAILABLE),
        (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    ):
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


def trailers(error: MaskserveError, request_id: str) -> Metadata:
    """The trailing metadata of a call that ends with ``error``."""
    found = [(REQUEST_ID_KEY, request_id), (ERROR_TYPE_KEY, error.kind)]
    field = getattr(error, "field", None)
    if field:
        found.append((ERROR_FIELD_KEY, str(field)))
    if error.retry_after is not None:
        # Whole milliseconds, rounded up, and at least a second as Retry-After is: a client told to
        # come back at once would only add to the load it was refused for.
        found.append((PUSHBACK_KEY, str(max(1000, math.ceil(error.retry_after * 1000)))))
    return tuple(found)
