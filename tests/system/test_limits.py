"""Every request limit answers a clear 4xx naming the problem; no request reaches a file or a model path."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from aiohttp import ClientResponse

from maskserve.serving.costs import BatchReport
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, EchoModel, default_parts
from tests.unit.middleware.test_error_sanitizer import DETAIL_KEYS

OK = "paris is the [MASK] of france."


async def error_of(response: ClientResponse, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    body: dict[str, Any] = await response.json()
    assert {"error", "error_type", "request_id"} <= set(body) <= {"error", "error_type", "request_id", *DETAIL_KEYS}
    return body


async def test_a_body_over_max_body_bytes_is_413(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel(), max_body_bytes=1000)
    error = await error_of(await client.post("/", data=b"a [MASK] " * 200), 413)
    assert error["error_type"] == "payload_too_large"
    assert (await client.post("/", data=b"a " * 450 + b"[MASK]")).status == 200


async def test_a_text_over_max_text_chars_is_422_text_too_long(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel(), max_text_chars=50)
    error = await error_of(await client.post("/", data="[MASK] " + "x" * 60), 422)
    assert error["error_type"] == "text_too_long"
    assert "the limit is 50" in error["error"]


async def test_a_text_over_max_text_tokens_is_422_naming_both_numbers(make_client: ClientFactory) -> None:
    client = await make_client(max_text_tokens=1000)  # tiny BERT: 128 tokens, windows up to 1000
    error = await error_of(await client.post("/", data="[MASK] " + "word " * 1500), 422)
    assert error["error_type"] == "text_too_long"
    assert "1503 tokens; the limit is 1000 (--max-text-tokens)" in error["error"]
    # Under the limit, a text longer than the model is read in windows; asked not to, it is refused.
    answered = await client.post("/", data="[MASK] " + "word " * 900)
    assert answered.status == 200 and answered.headers["X-Text-Windows"] == "1"
    refused = {"inputs": "[MASK] " + "word " * 900, "parameters": {"long_text": "refuse"}}
    error = await error_of(await client.post("/", json=refused), 422)
    assert error["error_type"] == "text_too_long" and "reads at most 128" in error["error"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"inputs": [OK] * 5}, "inputs holds more than 4 items"),
        ({"inputs": OK, "parameters": {"targets": ["a", "b", "c", "d"]}}, "parameters.targets holds more than 3 items"),
        ({"inputs": OK, "parameters": {"top_k": 11}}, "parameters.top_k must be between 1 and 10"),
        ({"inputs": OK, "parameters": {"top_k": 0}}, "parameters.top_k must be between 1 and 10"),
        ({"inputs": OK, "parameters": {"top_k": 10**4000}}, "parameters.top_k must be between 1 and 10"),
        ({"inputs": []}, "inputs must not be empty"),
    ],
)
async def test_counts_and_ranges_over_their_limit_are_422_naming_the_field(
    make_client: ClientFactory, body: dict[str, Any], named: str
) -> None:
    client = await make_client(engine=EchoModel(), max_inputs=4, max_targets=3, max_top_k=10)
    error = await error_of(await client.post("/", json=body), 422)
    assert error["error_type"] == "invalid_input"
    assert named in error["error"]
    assert error["field"] == named.split()[0]  # the same path, for programs


@pytest.mark.parametrize(
    ("request_kwargs", "field"),
    [
        ({"data": "no mask here"}, "inputs"),  # a raw-text body is the inputs
        ({"json": {"inputs": [OK, "   "]}}, "inputs[1]"),
        ({"json": {"inputs": [OK, "no mask"]}}, "inputs[1]"),
        ({"json": {"inputs": OK, "parameters": {"targets": [""]}}}, "parameters.targets"),
        ({"json": {"parameters": {}}}, "inputs"),
        ({"json": {"inputs": OK}, "headers": {"X-Request-Timeout": "soon"}}, "X-Request-Timeout"),
    ],
)
async def test_a_4xx_about_one_part_of_the_request_names_it_in_field(
    make_client: ClientFactory, request_kwargs: dict[str, Any], field: str
) -> None:
    client = await make_client(engine=EchoModel())
    response = await client.post("/", **request_kwargs)
    assert 400 <= response.status < 500
    assert (await error_of(response, response.status))["field"] == field


async def test_an_error_about_the_whole_body_names_no_field(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel())
    error = await error_of(await client.post("/", data=b"{", headers={"Content-Type": "application/json"}), 400)
    assert error["error_type"] == "invalid_body" and "field" not in error


async def test_lists_at_their_limits_are_accepted(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel(), max_inputs=4, max_targets=3, max_top_k=10)
    body = {"inputs": [OK] * 4, "parameters": {"top_k": 10, "targets": ["a", "bb", "ccc"]}}
    assert (await client.post("/", json=body)).status == 200


@pytest.mark.parametrize("depth", [33, 100, 990, 100_000])
async def test_json_nested_past_32_levels_is_400_at_any_depth(make_client: ClientFactory, depth: int) -> None:
    client = await make_client(engine=EchoModel())
    body = '{"inputs": "a [MASK]", "options": ' + "[" * depth + "]" * depth + "}"
    error = await error_of(await client.post("/", data=body, headers={"Content-Type": "application/json"}), 400)
    assert error["error_type"] == "invalid_body" and "nested too deeply" in error["error"]


async def test_an_integer_past_pythons_digit_limit_is_400_not_a_crash(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel())
    body = '{"inputs": "a [MASK]", "parameters": {"top_k": ' + "9" * 5000 + "}}"
    error = await error_of(await client.post("/", data=body, headers={"Content-Type": "application/json"}), 400)
    assert error["error_type"] == "invalid_body"


async def test_a_huge_list_is_refused_without_validating_every_item(make_client: ClientFactory) -> None:
    # 300,000 items: schema validation of each used to hold the event loop for seconds.
    client = await make_client(engine=EchoModel(), max_body_bytes=2_000_000)
    body = json.dumps({"inputs": [1] * 300_000})
    response = await client.post("/", data=io.BytesIO(body.encode()), headers={"Content-Type": "application/json"})
    error = await error_of(response, 422)
    assert error["error"] == "inputs holds more than 64 items"


async def test_a_hundred_thousand_unknown_fields_are_named_three_at_most(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel(), max_body_bytes=4_000_000)
    body = json.dumps({"inputs": OK, **{f"field{i}": 1 for i in range(100_000)}})
    # A large body as a stream, as aiohttp's client asks.
    response = await client.post("/", data=io.BytesIO(body.encode()), headers={"Content-Type": "application/json"})
    error = await error_of(response, 422)
    assert error["error"] == 'body: unknown fields "field0", "field1", "field2" and 99997 more'


@pytest.mark.parametrize(
    "extra",
    [{"model": "/etc/passwd"}, {"model_path": "../../etc/passwd"}, {"file": "/etc/shadow"}, {"revision": "main"}],
)
async def test_no_request_can_name_a_model_or_a_file(make_client: ClientFactory, extra: dict[str, str]) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    error = await error_of(await client.post("/", json={"inputs": OK, **extra}), 422)
    assert error["error_type"] == "invalid_input"
    (name,) = extra
    assert f'unknown field "{name}"' in error["error"]
    assert model.batches == []  # refused before anything was queued
    # Under "parameters" it is an unknown parameter, refused and named.
    error = await error_of(await client.post("/", json={"inputs": OK, "parameters": extra}), 422)
    assert error["error_type"] == "invalid_input"
    assert f'unknown field "{name}"' in error["error"] and "root:" not in error["error"]
    assert model.batches == []
    # "options" is the old Inference API clients' (wait_for_model, ...), read by nothing: the text
    # is answered as if it were absent, and the name reaches nothing.
    response = await client.post("/", json={"inputs": OK, "options": extra})
    assert response.status == 200, await response.text()
    assert model.batches == [[model.encode(OK)]]


@pytest.mark.parametrize(
    "path",
    [
        "/static/../setup.cfg",
        "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/..%2f..%2fsetup.cfg",
        "/static/%2fetc%2fpasswd",
        "/static//etc/passwd",
        "/static/no-such-file.css",
        "/static/" + "x" * 300,  # too long a name for the filesystem: no such file, not a 500
        "/static/" + "\u0303" * 200 + ".css",  # the same, in bytes, with combining characters
        "/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/templates/index.html",
        "/maskserve/http/app.py",
    ],
)
async def test_path_traversal_and_unknown_files_are_404_in_the_error_shape(
    make_client: ClientFactory, path: str
) -> None:
    client = await make_client(engine=EchoModel())
    response = await client.get(path)
    error = await error_of(response, 404)
    assert error["error_type"] == "not_found"
    assert error["request_id"] == response.headers["X-Request-Id"]


async def test_the_static_files_that_exist_are_served(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel())
    assert (await client.get("/static/demo.css")).status == 200


# Each limit on what a request's answer costs, with a request just over it and one at it; every
# refusal comes before the model runs anything.
COST_LIMITS = [
    pytest.param(
        {"max_masks_per_text": 3},
        {"inputs": ["[MASK] " * 4]},
        {"inputs": ["[MASK] " * 3]},
        "too_many_masks",
        "inputs",
        id="masks_per_text",
    ),
    pytest.param(
        {"max_predictions": 12},
        {"inputs": ["a [MASK] [MASK]", "b [MASK]"], "parameters": {"top_k": 5}},
        {"inputs": ["a [MASK] [MASK]", "b [MASK]"], "parameters": {"top_k": 4}},
        "too_many_predictions",
        None,
        id="predictions",
    ),
    pytest.param(
        # EchoModel's bound: 128 bytes and 8 a token per prediction; this text has 103 tokens, and
        # the list around the answer adds 4 bytes.
        {"max_response_bytes": 10 * (128 + 8 * 103) + 4},
        {"inputs": ["w " * 100 + "[MASK]"], "parameters": {"top_k": 11}},
        {"inputs": ["w " * 100 + "[MASK]"], "parameters": {"top_k": 10}},
        "response_too_large",
        None,
        id="response_bytes",
    ),
]


@pytest.mark.parametrize(("limit", "over", "at", "kind", "field"), COST_LIMITS)
async def test_a_request_over_a_cost_limit_is_422_before_any_model_work(
    make_client: ClientFactory,
    limit: dict[str, int],
    over: dict[str, Any],
    at: dict[str, Any],
    kind: str,
    field: str | None,
) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, **limit)
    error = await error_of(await client.post("/", json=over), 422)
    assert error["error_type"] == kind
    assert str(next(iter(limit.values()))) in error["error"]  # the message names the limit
    assert error.get("field") == field
    assert model.batches == []
    assert (await client.post("/", json=at)).status == 200


async def test_a_request_that_could_never_finish_in_time_is_422_and_a_shorter_deadline_504(
    make_client: ClientFactory,
) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, request_timeout=10.0)
    batcher = default_parts(client).batcher
    # Measured: a pass takes 0.1 s plus 10 ms a token.
    for tokens in (10, 20, 40):
        report = BatchReport(size=1, real_tokens=tokens, padded_tokens=tokens, seconds=0.1 + tokens * 0.01, failed=0)
        batcher.cost.observe(report)
    long_texts = ["w " * 298 + "[MASK]"] * 4  # 1200 tokens, about 12 s alone: over the server's 10 s
    error = await error_of(await client.post("/", json={"inputs": long_texts}), 422)
    assert error["error_type"] == "request_too_costly" and "fewer or shorter" in error["error"]
    medium = "w " * 300 + "[MASK]"  # about 3 s: fine for the server, not within the client's 1 s
    response = await client.post("/", data=medium, headers={"X-Request-Timeout": "1"})
    assert (await error_of(response, 504))["error_type"] == "timeout"
    assert model.batches == []
    assert (await client.post("/", data=medium)).status == 200
