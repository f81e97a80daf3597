"""rpc/status.py: each error's gRPC status, and the trailers that carry its facts."""

from __future__ import annotations

import grpc
import pytest

from maskserve.errors import (
    BodyTimeout,
    DeadlineExceeded,
    InferenceFailed,
    InternalError,
    InvalidBody,
    MaskserveError,
    NoMaskToken,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    RequestTooCostly,
    ShuttingDown,
    TextTooLong,
    Unauthorized,
)
from maskserve.rpc.status import ERROR_FIELD_KEY, ERROR_TYPE_KEY, PUSHBACK_KEY, REQUEST_ID_KEY, status_code, trailers

Code = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidBody("x"), Code.INVALID_ARGUMENT),
        (NoMaskToken("x"), Code.INVALID_ARGUMENT),
        (TextTooLong("x"), Code.INVALID_ARGUMENT),
        (RequestTooCostly("x"), Code.INVALID_ARGUMENT),
        (BodyTimeout("x"), Code.INVALID_ARGUMENT),
        (Unauthorized("x"), Code.UNAUTHENTICATED),
        (NotFound("x"), Code.NOT_FOUND),
        (PayloadTooLarge("x"), Code.RESOURCE_EXHAUSTED),
        (RateLimited("x"), Code.RESOURCE_EXHAUSTED),
        (Overloaded("x", retry_after=2.5), Code.UNAVAILABLE),
        (ShuttingDown("x"), Code.UNAVAILABLE),
        (DeadlineExceeded("x"), Code.DEADLINE_EXCEEDED),
        (InferenceFailed("x"), Code.INTERNAL),
        (InternalError("x"), Code.INTERNAL),
    ],
)
def test_each_error_is_the_status_that_says_the_same(error: MaskserveError, code: grpc.StatusCode) -> None:
    assert status_code(error) is code


def test_trailers_carry_the_id_the_kind_the_field_and_the_pushback() -> None:
    found = dict(trailers(Overloaded("busy", retry_after=2.5), "id-1"))
    assert found == {REQUEST_ID_KEY: "id-1", ERROR_TYPE_KEY: "overloaded", PUSHBACK_KEY: "2500"}
    # At least a second, as Retry-After is: no client is told to come back at once.
    assert dict(trailers(Overloaded("busy", retry_after=0.01), "id-2"))[PUSHBACK_KEY] == "1000"
    invalid = dict(trailers(NoMaskToken("no mask", field="inputs[0].data"), "id-3"))
    assert invalid == {REQUEST_ID_KEY: "id-3", ERROR_TYPE_KEY: "no_mask_token", ERROR_FIELD_KEY: "inputs[0].data"}
