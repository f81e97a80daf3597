"""The error middleware: one sanitized shape for every error, request ids, and a fixed 500."""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import pytest
from aiohttp import ClientResponse

from maskserve.engine import FillMaskEngine
from maskserve.errors import INTERNAL_MESSAGE
from maskserve.middleware.error_sanitizer import new_request_id
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel

PARIS = b"paris is the [MASK] of france."


# Keys an error body may carry besides the three every one has (errors.MaskserveError.details).
DETAIL_KEYS = {"retry_after", "field"}


async def error_of(response: ClientResponse, status: int, kind: str) -> dict[str, Any]:
    """The error body, checked for the one shape every error response has (the HF/TGI/TEI one)."""
    assert response.status == status
    assert response.content_type == "application/json"
    error: dict[str, Any] = await response.json()
    assert {"error", "error_type", "request_id"} <= set(error) <= {"error", "error_type", "request_id", *DETAIL_KEYS}
    assert error["error_type"] == kind
    assert isinstance(error["error"], str) and error["error"]
    assert error["request_id"] == response.headers["X-Request-Id"]
    if status in (429, 503):
        assert error["retry_after"] == int(response.headers["Retry-After"])
    return error


async def test_unknown_path_is_404_in_the_error_shape(make_client: ClientFactory) -> None:
    client = await make_client()
    error = await error_of(await client.post("/no/such/path", data=PARIS), 404, "not_found")
    assert "Not Found" not in error["error"]  # ours, not aiohttp's text


async def test_wrong_method_is_405_with_allow_header(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.put("/", data=PARIS)
    await error_of(response, 405, "method_not_allowed")
    assert "POST" in response.headers["Allow"]


async def test_body_over_the_limit_is_413(make_client: ClientFactory) -> None:
    client = await make_client(max_body_bytes=64)
    at_limit = b"[MASK]" + b" dog" * 14 + b" ."
    assert len(at_limit) == 64
    await error_of(await client.post("/", data=at_limit + b"!"), 413, "payload_too_large")
    assert (await client.post("/", data=at_limit)).status == 200


async def test_client_errors_share_the_shape(make_client: ClientFactory) -> None:
    client = await make_client()
    await error_of(await client.post("/", data=b"no mask"), 422, "no_mask_token")
    await error_of(await client.post("/", data=b"{", headers={"Content-Type": "application/json"}), 400, "invalid_body")


async def test_generated_request_id_is_on_success_and_error(make_client: ClientFactory) -> None:
    client = await make_client()
    ok = await client.post("/", data=PARIS)
    assert ok.status == 200 and re.fullmatch(r"[0-9a-f]{32}", ok.headers["X-Request-Id"])
    again = await client.post("/", data=PARIS)
    assert again.headers["X-Request-Id"] != ok.headers["X-Request-Id"]


async def test_safe_caller_request_id_is_echoed(make_client: ClientFactory) -> None:
    client = await make_client()
    ok = await client.post("/", data=PARIS, headers={"X-Request-Id": "trace-42.a:b_c"})
    assert ok.headers["X-Request-Id"] == "trace-42.a:b_c"
    failed = await client.post("/", data=b"no mask", headers={"X-Request-Id": "trace-43"})
    assert (await error_of(failed, 422, "no_mask_token"))["request_id"] == "trace-43"


@pytest.mark.parametrize("unsafe", ["has space", "x" * 65, "semi;colon", "new\\nline", 'quote"d'])
async def test_unsafe_caller_request_id_is_replaced(make_client: ClientFactory, unsafe: str) -> None:
    client = await make_client()
    failed = await client.post("/nowhere", headers={"X-Request-Id": unsafe})
    error = await error_of(failed, 404, "not_found")
    assert error["request_id"] != unsafe and re.fullmatch(r"[0-9a-f]{32}", error["request_id"])


async def test_unexpected_exception_is_a_fixed_500_and_logged_with_traceback(
    make_client: ClientFactory, bert_engine: FillMaskEngine, caplog: pytest.LogCaptureFixture
) -> None:
    model = ControlledModel(bert_engine)
    model.encode_error = RuntimeError("/secret/path boom")  # unexpected, its message full of secrets
    client = await make_client(engine=model)
    with caplog.at_level(logging.ERROR, logger="maskserve"):
        response = await client.post("/", data=PARIS)
    error = await error_of(response, 500, "internal")
    assert error["error"] == INTERNAL_MESSAGE
    text = await response.text()
    for leak in ("secret", "boom", "/secret/path", "RuntimeError", "Traceback", "ExplodingEncoder", "encode"):
        assert leak not in text
    assert all(leak not in value for value in response.headers.values() for leak in ("secret", "boom"))
    logged = [r for r in caplog.records if r.exc_info and error["request_id"] in r.getMessage()]
    assert logged, "the 500 left no log record carrying its request id"
    assert "RuntimeError: /secret/path boom" in caplog.text and "Traceback" in caplog.text
    # One failure does not stop the server.
    assert (await client.post("/nowhere")).status == 404


def test_new_request_ids_are_distinct_and_a_forked_process_gets_its_own() -> None:
    ids = {new_request_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as a --workers worker would, right after the fork
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert child[:16] != new_request_id()[:16]
