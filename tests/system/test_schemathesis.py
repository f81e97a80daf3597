"""Schemathesis, driven by the server's own ``GET /openapi.json``, against the real app on a port.

For every documented operation it generates valid and invalid requests (bodies, headers, query
and path parameters) and checks each answer against the document (status, content type,
headers, body schema) and against our own invariants: never a 500, errors in the sanitized
shape, nothing that betrays the server's insides. Budget: ``MASKSERVE_FUZZ_EXAMPLES`` per
operation and mode, as in test_fuzz.py.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, CheckContext, GenerationMode, Response
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from maskserve.api.openapi import openapi_document
from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.http.app import create_app
from maskserve.http.routes import ROUTE_ROLES
from tests.live_server import serve_in_thread
from tests.paths import ROOT
from tests.system.test_fuzz import EXAMPLES, EXCEPTION_NAME, LEAK_MARKERS
from tests.unit.middleware.test_error_sanitizer import DETAIL_KEYS

pytestmark = pytest.mark.fuzz

SETTINGS = Settings(max_body_bytes=64 * 1024, max_text_chars=2000, max_inputs=8, max_top_k=20, max_targets=8)
DOCUMENT = openapi_document(SETTINGS, ROUTE_ROLES)
SENT: Counter[int] = Counter()


@pytest.fixture(scope="module")
def live_url(bert_engine: FillMaskEngine) -> Iterator[str]:
    with serve_in_thread(create_app(SETTINGS, engine=bert_engine)) as url:
        yield url
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    figures = {"examples_per_operation": EXAMPLES, "requests": sum(SENT.values()), "statuses": dict(SENT)}
    print("schemathesis:", json.dumps(figures))
    (artifacts / "schemathesis.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def live_schema(live_url: str, bert_dir: Path) -> schemathesis.BaseSchema:
    # The document as the server serves it, not as the tests build it.
    schema = schemathesis.openapi.from_url(f"{live_url}/openapi.json")
    return schema


def sanitized(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Our invariants on every answer: never a 500, the error shape, no internals."""
    SENT[response.status_code] += 1
    if response.status_code in (503, 504):
        # Only a deadline too short to meet (X-Request-Timeout is any positive number) is refused
        # at the door (503) or times out (504); the server is otherwise idle.
        assert float((case.headers or {}).get("X-Request-Timeout", "inf")) < 1, response.text[:300]
    else:
        assert response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
    sent = repr(case.body) + repr(case.headers) + repr(case.query) + repr(case.path_parameters)
    text = response.text
    for marker in LEAK_MARKERS:
        assert marker not in text or marker in sent, f"{marker!r} in a {response.status_code} answer"
    for name in EXCEPTION_NAME.findall(text):
        assert name in sent, f"exception name {name!r} in a {response.status_code} answer"
    if response.status_code >= 400 and response.headers.get("content-type", [""])[0].startswith("application/json"):
        error = json.loads(text)
        if case.operation.path.endswith("/ready"):
            # A model's readiness answers not ready (400, as Triton does) in the probes' shape:
            # a status and the problems, each with a stable code.
            assert error["status"] == "unavailable" and error["problems"], error
            assert all(set(problem) == {"code", "message"} for problem in error["problems"]), error
            return None
        assert (
            {"error", "error_type", "request_id"} <= set(error) <= {"error", "error_type", "request_id", *DETAIL_KEYS}
        )
        assert isinstance(error["error"], str), error
    return None


# Each documented operation, in both modes. (schemathesis' own pytest loader does not run under
# pytest 9, so the operations' hypothesis strategies are driven directly.)
def negatable(method: str, path: str) -> bool:
    """Whether the operation has anything an invalid request could get wrong (a body, a typed header)."""
    operation = DOCUMENT["paths"][path][method]
    typed = [
        p for p in operation.get("parameters", []) if p["schema"].get("type") != "string" or "pattern" in p["schema"]
    ]
    return "requestBody" in operation or bool(typed)


CASES = [
    pytest.param(method, path, mode, id=f"{method.upper()} {path} {mode.value}")
    for method, path in sorted((route.method, route.path) for route in ROUTE_ROLES.operations)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or negatable(method, path)
]


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_every_operation_honours_the_document_and_never_fails_on_client_input(
    live_schema: schemathesis.BaseSchema, live_url: str, method: str, path: str, mode: GenerationMode
) -> None:
    operation = live_schema[path][method.upper()]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    def run(case: Case) -> None:
        # Bodies valid by the schema may still be refused on meaning (no mask token: 422), so
        # "valid data is accepted" does not hold for this API; and `sanitized` replaces "no 5xx",
        # allowing 503/504 for deadlines too short to meet. Every other built-in check runs.
        case.call_and_validate(
            base_url=live_url,
            additional_checks=[sanitized],
            excluded_checks=[positive_data_acceptance, not_a_server_error],
        )

    run()
