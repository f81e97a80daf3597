"""Fuzzing the real server with hypothesis: generated bodies, content types, headers and paths.

Every answer must be a client error or a success (never a 500 for a client's mistake), every error
must have the shape of ``{"error", "error_type", "request_id", ...}``, and no answer may carry a
traceback, a file path, an exception class name or the model's path, unless the request itself
sent that text (error messages name the caller's own unknown fields).

The budget per test is ``MASKSERVE_FUZZ_EXAMPLES`` (CI: the default below; by hand, see
docs/reliability.md). The totals go to ``artifacts/fuzz.json``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maskserve
from maskserve.api.openapi import openapi_document
from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.http.app import create_app
from maskserve.http.routes import ROUTE_ROLES
from tests.live_server import serve_in_thread
from tests.paths import ROOT

EXAMPLES = int(os.environ.get("MASKSERVE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # leave no .hypothesis/ behind; a failure prints its reproduction blob
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
pytestmark = pytest.mark.fuzz

SETTINGS = Settings(max_body_bytes=64 * 1024, max_text_chars=2000, max_inputs=8, max_top_k=20, max_targets=8)
DOCUMENT = openapi_document(SETTINGS, ROUTE_ROLES)
ERROR_SCHEMA = {**DOCUMENT["components"]["schemas"]["Error"], "$defs": {}}
RESPONSE_VALIDATOR = jsonschema.Draft202012Validator(
    {"$ref": "#/components/schemas/FillMaskResponse", "components": DOCUMENT["components"]}
)
ERROR_VALIDATOR = jsonschema.Draft202012Validator(ERROR_SCHEMA)

# What would betray the server's insides, whatever the status.
LEAK_MARKERS = ("Traceback", 'File "', "site-packages", "dist-packages", ".py", sys.prefix, "/usr/lib")
# ValueError, OSError, JSONDecodeError... (a bare "Error" is a word, as in the page's title).
EXCEPTION_NAME = re.compile(r"\b[A-Z][A-Za-z]+(?:Error|Exception|Warning)\b")


@dataclass
class Server:
    """A live server and the tally of what was sent to it."""

    url: str
    secrets: tuple[str, ...]
    statuses: Counter[int] = field(default_factory=Counter)
    _connection: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def send(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Reply:
        # Header values beyond latin-1 go as their UTF-8 bytes, as a careless client would send them.
        raw_headers = {name: value.encode("utf-8") for name, value in (headers or {}).items()}
        for attempt in range(2):
            if self._connection is None:
                netloc = urlsplit(self.url).netloc
                self._connection = http.client.HTTPConnection(netloc, timeout=60)
            try:
                self._connection.request(method, path, body=body, headers=raw_headers)
                response = self._connection.getresponse()
                reply = Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
            except (ConnectionError, http.client.HTTPException):
                # The server may close a connection after an error (e.g. an unread large body).
                self._connection.close()
                self._connection = None
                if attempt:
                    raise
                continue
            if reply.headers.get("connection", "").lower() == "close":
                self._connection.close()
                self._connection = None
            self.statuses[reply.status] += 1
            return reply
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0]

    @property
    def refused_by_http_parser(self) -> bool:
        """aiohttp's HTTP parser refused the request (e.g. a control character in a header) with a
        plain-text 400 of its own, before any middleware could run: a known limit of the error shape."""
        return self.status == 400 and self.content_type == "text/plain" and "x-request-id" not in self.headers


@pytest.fixture(scope="module")
def server(bert_engine: FillMaskEngine, bert_dir: Path) -> Iterator[Server]:
    app = create_app(SETTINGS, engine=bert_engine)
    with serve_in_thread(app) as url:
        live = Server(url, secrets=(str(bert_dir), str(bert_dir.parent), str(Path(maskserve.__file__).parent)))
        yield live
        live.close()
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    figures = {
        "examples_per_test": EXAMPLES,
        "requests": sum(live.statuses.values()),
        "statuses": {str(k): v for k, v in sorted(live.statuses.items())},
    }
    print("fuzz:", json.dumps(figures))
    (artifacts / "fuzz.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


def assert_sane(reply: Reply, sent: bytes | str, allowed: set[int]) -> None:
    """The invariants every fuzzed answer keeps."""
    sent_text = sent if isinstance(sent, str) else sent.decode("utf-8", "replace")
    assert reply.status in allowed, (reply.status, reply.body[:300])
    assert reply.status < 500 or reply.status in {503, 504}, reply.body[:300]
    text = reply.body.decode("utf-8", "replace")
    if reply.content_type == "application/json" and reply.body:  # HEAD answers have no body
        parsed = json.loads(text)
        # Compare decoded strings too: JSON escapes quotes and non-ASCII.
        text = text + "\n" + json.dumps(parsed, ensure_ascii=False)
    for marker in LEAK_MARKERS:
        assert marker not in text or marker in sent_text, f"{marker!r} in a {reply.status} answer"
    for name in EXCEPTION_NAME.findall(text):
        assert name in sent_text, f"exception name {name!r} in a {reply.status} answer"
    if reply.refused_by_http_parser:
        return
    if reply.status >= 400 and reply.content_type == "application/json" and reply.body:
        error = json.loads(reply.body)
        ERROR_VALIDATOR.validate(error)
        assert error["request_id"] == reply.headers["x-request-id"]


def assert_no_secrets(server: Server, reply: Reply) -> None:
    text = reply.body.decode("utf-8", "replace")
    for secret in server.secrets:
        assert secret not in text, f"the server's path {secret} in a {reply.status} answer"


def check(server: Server, reply: Reply, sent: bytes | str, allowed: set[int]) -> None:
    assert_sane(reply, sent, allowed)
    assert_no_secrets(server, reply)


# -- strategies ---------------------------------------------------------------------------------

# Characters that break naive text handling: zero-width and joiners, bidi controls, combining
# marks, BOM, NUL and other controls, line separators, astral emoji, CJK, Arabic, Hebrew.
TRICKY = (
    "\u200b\u200c\u200d\u2060\ufeff\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    "\u0300\u0301\u0308\u0338\x00\x01\x1b\x7f\u0085\u2028\u2029\t\r\n "
    "\U0001f600\U0001f9d1\u200d\U0001f4bb\u4e2d\u6587\u0627\u0644\u05e2\u05d1\ufb01\u00df\u0130"
)
MASKY = ["[MASK]", "[MASK]", "[mask]", "[MASK", "MASK]", "<mask>", "[ MASK ]", "[MASK][MASK]", "\u200b[MASK]\u200b"]
WORD = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(TRICKY), max_size=12)
TEXT = st.lists(st.one_of(WORD, st.sampled_from(MASKY)), max_size=30).map(" ".join)
HUGE_NUMBER = st.one_of(
    st.integers(min_value=-(10**60), max_value=10**60),
    st.floats(allow_nan=True, allow_infinity=True),
    # 4,001 digits: just under Python's int parsing limit (4,300), which test_limits crosses.
    st.sampled_from([10**4000, -(10**4000), 5.0, -0.0, 1e-320, 1e308]),
)
JSON_SCALAR = st.one_of(st.none(), st.booleans(), HUGE_NUMBER, TEXT)
JSON_VALUE = st.recursive(
    JSON_SCALAR,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(WORD, inner, max_size=5),
    max_leaves=20,
)
INPUTS = st.one_of(TEXT, st.lists(TEXT, max_size=10), JSON_VALUE)
TARGETS = st.one_of(st.none(), WORD, st.lists(WORD, max_size=10), JSON_VALUE)
PARAMETERS = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {}, optional={"top_k": st.one_of(st.integers(-5, 30), HUGE_NUMBER, JSON_VALUE), "targets": TARGETS}
    ),
    JSON_VALUE,
)
REQUEST = st.fixed_dictionaries(
    {"inputs": INPUTS},
    optional={"parameters": PARAMETERS, "options": JSON_VALUE, "model": st.just("/etc/passwd"), "extra": JSON_VALUE},
)
CONTENT_TYPES = st.one_of(
    st.sampled_from(
        [
            "",
            "text/plain",
            "text/plain; charset=utf-8",
            "application/json",
            "APPLICATION/JSON",
            "application/json; charset=latin-1",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/octet-stream",
            "*/*",
            ";;;",
        ]
    ),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60),
)
STATUSES_FOR_BODIES = {200, 400, 413, 422}


# -- tests --------------------------------------------------------------------------------------


@FUZZ
@given(body=st.binary(max_size=4096), content_type=CONTENT_TYPES)
def test_random_bytes_under_any_content_type_get_a_clean_answer(server: Server, body: bytes, content_type: str) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    reply = server.send("POST", "/", body, headers)
    check(server, reply, body, STATUSES_FOR_BODIES)
    assert reply.content_type == "application/json"


@FUZZ
@given(text=TEXT, content_type=st.sampled_from(["text/plain", "application/x-www-form-urlencoded", ""]))
def test_generated_texts_with_tricky_unicode_and_several_masks_get_an_answer_or_a_422(
    server: Server, text: str, content_type: str
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    reply = server.send("POST", "/", text.encode("utf-8"), headers)
    check(server, reply, text, {200, 422})
    if reply.status == 200:
        RESPONSE_VALIDATOR.validate(json.loads(reply.body))


@FUZZ
@given(document=st.one_of(REQUEST, JSON_VALUE))
def test_generated_json_documents_get_an_answer_or_a_4xx_naming_the_problem(server: Server, document: Any) -> None:
    body = json.dumps(document, allow_nan=True).encode("utf-8")
    reply = server.send("POST", "/", body, {"Content-Type": "application/json"})
    check(server, reply, body, STATUSES_FOR_BODIES)
    if reply.status == 200:
        RESPONSE_VALIDATOR.validate(json.loads(reply.body))
    else:
        assert json.loads(reply.body)["error"].strip()


@FUZZ
@given(
    depth=st.integers(min_value=1, max_value=3000),
    container=st.sampled_from(["[%s]", '{"k": %s}', "[1, %s]"]),
    where=st.sampled_from(
        [
            "%s",
            '{"inputs": %s}',
            '{"inputs": "a [MASK]", "options": %s}',
            '{"inputs": "a [MASK]", "parameters": {"targets": %s}}',
            '{"inputs": ["a [MASK]", %s]}',
        ]
    ),
)
def test_deeply_nested_json_is_a_4xx_at_any_depth(server: Server, depth: int, container: str, where: str) -> None:
    nested = "0"
    for _ in range(depth):
        nested = container % nested
    body = (where % nested).encode()
    reply = server.send("POST", "/", body, {"Content-Type": "application/json"})
    check(server, reply, body, {200, 400, 422})
    if depth > 40:
        assert reply.status == 400 and b"nested too deeply" in reply.body


@FUZZ
@given(
    timeout=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=30),
        st.sampled_from(["1e-300", "0", "-0", "nan", "inf", "0x10", "1_000", " 2.5 ", "\u0663", "2.5s", "1e309"]),
    ),
    request_id=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=80),
    content_type=CONTENT_TYPES,
)
def test_generated_headers_are_used_or_refused_with_a_400(
    server: Server, timeout: str, request_id: str, content_type: str
) -> None:
    headers = {"X-Request-Timeout": timeout.strip() or "x", "X-Request-Id": request_id.strip() or "x"}
    if content_type:
        headers["Content-Type"] = content_type
    body = b"paris is the [MASK] of france."
    reply = server.send("POST", "/", body, headers)
    sent = " ".join(headers.values())
    # A positive but tiny deadline is honoured: refused at the door (503) or timed out (504).
    check(server, reply, sent, {200, 400, 422, 503, 504})
    if reply.refused_by_http_parser:
        assert any(ord(c) < 0x20 or ord(c) == 0x7F for c in sent), sent
        return
    if reply.status == 400:
        kind = json.loads(reply.body)["error_type"]
        assert kind in {"invalid_header", "invalid_body"}
    if reply.status in {503, 504}:
        assert float(headers["X-Request-Timeout"]) < 1
    # The caller's id comes back only when it is short and plain; otherwise a fresh one.
    if re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", headers["X-Request-Id"]):
        assert reply.headers["x-request-id"] == headers["X-Request-Id"]
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", reply.headers["x-request-id"])


@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(["text", "top_k", "other"]), st.one_of(TEXT, HUGE_NUMBER.map(str)), max_size=3
    ),
    raw=st.one_of(st.none(), st.binary(max_size=2048)),
    content_type=st.one_of(st.just("application/x-www-form-urlencoded"), CONTENT_TYPES),
)
def test_the_demo_form_answers_a_page_for_any_form(
    server: Server, fields: dict[str, str], raw: bytes | None, content_type: str
) -> None:
    body = raw if raw is not None else urlencode(fields).encode()
    reply = server.send("POST", "/demo", body, {"Content-Type": content_type} if content_type else {})
    check(server, reply, body.decode("utf-8", "replace") + " ".join(fields.values()), {200, 400, 413, 422})
    assert reply.content_type in {"text/html", "application/json"}


@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(["sentences", "metric", "other"]),
        st.one_of(TEXT, st.sampled_from(["original", "within_word_l2r", ""]), st.lists(TEXT).map("\n".join)),
        max_size=3,
    ),
    raw=st.one_of(st.none(), st.binary(max_size=2048)),
    content_type=st.one_of(st.just("application/x-www-form-urlencoded"), CONTENT_TYPES),
)
def test_the_scoring_form_answers_a_page_for_any_form(
    server: Server, fields: dict[str, str], raw: bytes | None, content_type: str
) -> None:
    body = raw if raw is not None else urlencode(fields).encode()
    reply = server.send("POST", "/demo/score", body, {"Content-Type": content_type} if content_type else {})
    check(server, reply, body.decode("utf-8", "replace") + " ".join(fields.values()), {200, 400, 413, 422})
    assert reply.content_type in {"text/html", "application/json"}


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "FOO"]),
    segments=st.lists(
        st.one_of(
            st.sampled_from(["..", ".", "%2e%2e", "static", "etc", "passwd", "demo", "livez", "~", "%00", "%2f"]),
            WORD.map(lambda w: quote(w, safe="")),
        ),
        max_size=6,
    ),
)
def test_any_method_on_any_path_is_answered_without_a_crash_or_a_leak(
    server: Server, method: str, segments: list[str]
) -> None:
    path = "/" + "/".join(segments)
    reply = server.send(method, path, b"" if method in {"POST", "PUT", "PATCH"} else None)
    check(server, reply, path, {200, 303, 400, 403, 404, 405, 413, 422})
    assert b"root:" not in reply.body  # no file outside the package is ever served
