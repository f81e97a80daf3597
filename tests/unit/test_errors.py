"""errors.py: each error's status, stable kind and headers, the tree its docstring draws, and the
Retry-After rounding."""

from __future__ import annotations

import re

import pytest

from maskserve import errors
from maskserve.errors import (
    INTERNAL_MESSAGE,
    ClientError,
    DeadlineExceeded,
    InvalidHeader,
    MaskserveError,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    RateLimited,
    ServiceUnavailable,
    ShuttingDown,
    TooManyConnections,
    Unauthorized,
    retry_after_seconds,
)


def error_classes() -> list[type[MaskserveError]]:
    """Every error class the module defines, the base included."""
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, MaskserveError) and value.__module__ == errors.__name__
    ]


def drawn_tree() -> dict[str, tuple[int, str, str | None]]:
    """The module docstring's tree: each class's status, kind and parent, as drawn."""
    tree: dict[str, tuple[int, str, str | None]] = {}
    parents: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        row = re.fullmatch(r"    ([│├└─ ]*)(\w+)\s+(\d{3}) (\w+).*", line)
        if row is None:
            continue
        depth = len(row[1]) // 4
        del parents[depth:]
        tree[row[2]] = (int(row[3]), row[4], parents[-1] if parents else None)
        parents.append(row[2])
    return tree


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn = drawn_tree()
    assert set(drawn) == {cls.__name__ for cls in error_classes()}
    for cls in error_classes():
        parent = None if cls is MaskserveError else cls.__bases__[0].__name__
        assert drawn[cls.__name__] == (cls.status, cls.kind, parent), cls.__name__


def test_every_error_below_the_base_has_its_own_kind() -> None:
    kinds = [cls.kind for cls in error_classes() if cls is not MaskserveError]
    assert len(kinds) == len(set(kinds))
    assert all(re.fullmatch(r"[a-z_]+", kind) for kind in kinds)


def test_client_errors_are_4xx_and_the_rest_5xx() -> None:
    for cls in error_classes():
        expected = range(400, 500) if issubclass(cls, ClientError) else range(500, 600)
        assert cls.status in expected, cls.__name__


def test_the_message_is_the_public_text_and_nothing_else() -> None:
    error = NotFound("no route for GET /nope")
    assert (error.message, str(error)) == ("no route for GET /nope", "no route for GET /nope")
    assert error.details() == {} and error.headers() == {}


def test_the_fixed_internal_message_names_the_request_id_and_no_internals() -> None:
    assert "request id" in INTERNAL_MESSAGE
    assert not re.search(r"Traceback|Error|File \"|0x[0-9a-f]", INTERNAL_MESSAGE)


@pytest.mark.parametrize(
    ("seconds", "header"), [(0.0, "1"), (0.2, "1"), (1.0, "1"), (1.01, "2"), (2.5, "3"), (30.0, "30")]
)
def test_retry_after_rounds_up_to_whole_seconds_of_at_least_one(seconds: float, header: str) -> None:
    assert retry_after_seconds(seconds) == header


def test_a_client_error_names_its_field_in_the_details() -> None:
    error = InvalidHeader("must be a number", field="X-Request-Timeout")
    assert error.details() == {"field": "X-Request-Timeout"}
    assert InvalidHeader("must be a number").details() == {}


@pytest.mark.parametrize("cls", [ServiceUnavailable, Overloaded, ShuttingDown, TooManyConnections, RateLimited])
def test_errors_that_may_pass_say_when_to_retry_in_header_and_body(cls: type[ServiceUnavailable]) -> None:
    error = cls("come back later", 2.2)
    assert error.headers() == {"Retry-After": "3"}
    assert error.details() == {"retry_after": 3}


def test_an_unavailable_error_says_retry_after_one_second_by_default() -> None:
    assert ServiceUnavailable("busy").headers() == {"Retry-After": "1"}


def test_a_deadline_passed_does_not_ask_for_a_retry() -> None:
    error = DeadlineExceeded("too late")
    assert (error.status, error.headers(), error.details()) == (504, {}, {})


def test_refusals_carry_their_reason() -> None:
    assert Overloaded("full").reason == "queue_full"
    assert Overloaded("slow", reason="predicted_timeout").reason == "predicted_timeout"
    assert ShuttingDown("bye").reason == "shutting_down"
    assert TooManyConnections("full").reason == "connection_limit"


def test_unauthorized_names_the_scheme_and_says_when_the_key_is_wrong() -> None:
    assert Unauthorized("no key").headers() == {"WWW-Authenticate": 'Bearer realm="maskserve"'}
    wrong = Unauthorized("bad key", invalid_token=True).headers()
    assert wrong == {"WWW-Authenticate": 'Bearer realm="maskserve", error="invalid_token"'}


def test_method_not_allowed_lists_the_allowed_methods_sorted() -> None:
    assert MethodNotAllowed("no", frozenset({"POST", "GET"})).headers() == {"Allow": "GET, POST"}
    assert MethodNotAllowed("no").headers() == {}
