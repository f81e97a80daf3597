"""GET /openapi.json: a valid OpenAPI 3.1 document of every route, with the server's own limits,
that real responses obey: every documented status is produced and checked against its schema."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from multidict import CIMultiDict
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from maskserve.api.openapi import openapi_document
from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.http.routes import ROUTE_ROLES
from maskserve.request.keys import SERVICE_KEY
from maskserve.tasks.fill_mask_request import request_schema
from maskserve.tasks.pseudo_likelihood import masked_copies
from maskserve.tasks.windows import Layout
from tests.conftest import CONTROL_KEY, ClientFactory
from tests.fakes import ControlledModel, default_parts, wait_until_entered
from tests.paths import TESTS

Client = TestClient[web.Request, web.Application]
DOCUMENT_URI = "urn:maskserve:openapi"


def media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def documented_routes(document: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (method, path, operation["operationId"])
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }


@dataclass
class Conformance:
    """Checks real responses against the document and remembers which (method, path, status) it saw."""

    document: dict[str, Any]
    seen: set[tuple[str, str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        resource = Resource.from_contents(self.document, default_specification=DRAFT202012)
        self.registry: Registry[Any] = Registry().with_resource(DOCUMENT_URI, resource)
        self.templates = [
            (re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$"), path)
            for path in self.document["paths"]
        ]

    def template(self, path: str) -> str:
        matches = [template for regex, template in self.templates if regex.match(path)]
        assert len(matches) == 1, f"{path} matches documented paths {matches}"
        return matches[0]

    def documented(self) -> set[tuple[str, str, str]]:
        return {
            (method.upper(), path, status)
            for path, item in self.document["paths"].items()
            for method, operation in item.items()
            for status in operation["responses"]
        }

    async def check(self, response: ClientResponse, status: int | None = None) -> ClientResponse:
        """Assert ``response`` is documented: status, content type, required headers, JSON schema."""
        if status is not None:
            assert response.status == status, (
                response.method,
                response.url.path,
                response.status,
                await response.text(),
            )
        self.check_parts(response.method, response.url.path, response.status, response.headers, await response.read())
        return response

    def check_parts(self, method: str, url_path: str, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """The same checks on an answer read off a raw socket."""
        path = self.template(url_path)
        where = f"{method} {path} {status}"
        responses = self.document["paths"][path][method.lower()]["responses"]
        assert str(status) in responses, f"{where}: status not documented"
        spec = responses[str(status)]
        for name, header in spec.get("headers", {}).items():
            if header.get("required"):
                assert name in headers, f"{where}: header {name} missing"
        content = spec.get("content")
        if not content:
            assert not body or status in (301, 302, 303, 307, 308), f"{where}: undocumented body"
        else:
            documented = {media_type(key): key for key in content}
            actual = media_type(headers.get("Content-Type", ""))
            assert actual in documented, f"{where}: content type {actual} not in {sorted(documented)}"
            schema = content[documented[actual]].get("schema")
            if actual == "application/json":
                ref = DOCUMENT_URI + "#/" + pointer("paths", path, method.lower(), "responses", str(status))
                ref += "/" + pointer("content", documented[actual], "schema")
                validator = jsonschema.Draft202012Validator({"$ref": ref}, registry=self.registry)
                errors = sorted(validator.iter_errors(json.loads(body)), key=str)
                assert not errors, f"{where}: {errors[0].message} at {list(errors[0].absolute_path)}"
            elif schema is not None and schema.get("type") == "string" and schema.get("format") != "binary":
                body.decode("utf-8")
        self.seen.add((method, path, str(status)))


async def body_that_stops(client: Client, path: str, content_type: str) -> tuple[int, CIMultiDict[str], bytes]:
    """POST ``path`` with headers and part of a body, then nothing: the server's answer, read until it closes."""
    assert client.server.host is not None and client.server.port is not None
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: maskserve\r\nContent-Type: {content_type}\r\nContent-Length: 100"
        writer.write(f"{head}\r\n\r\nparis is".encode())
        answer = await asyncio.wait_for(reader.read(), 5)  # answered, then closed
    finally:
        writer.close()
    head_bytes, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head_bytes.decode("latin-1").split("\r\n")
    headers: CIMultiDict[str] = CIMultiDict(tuple(line.split(": ", 1)) for line in lines)
    return int(status_line.split()[1]), headers, body


INFER = "/v2/models/maskserve/infer"
# The served model's routes, as the protocol lists them: without and with the version segment.
MODEL_PATHS = ("/v2/models/maskserve", "/v2/models/maskserve/versions/1")
INFER_PATHS = tuple(model + "/infer" for model in MODEL_PATHS)
# The default model's routes, and the same by its name.
FILL_PATHS = ("/", "/models/maskserve")
SCORE_PATHS = ("/score", "/models/maskserve/score")


def infer_body(*texts: str) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": list(texts)}]}


def router_operations(router: web.UrlDispatcher) -> set[tuple[str, str, str]]:
    """Every (method, path template, name) ``router`` serves; a static prefix serves the files below it."""
    operations = set()
    for route in router.routes():
        if route.method == "HEAD":  # aiohttp adds HEAD beside every GET: not documented apart
            continue
        resource = route.resource
        assert resource is not None and resource.name is not None, f"{route.method} {route} has no name"
        path = resource.canonical + ("/{filename}" if isinstance(resource, web.StaticResource) else "")
        operations.add((route.method.lower(), path, resource.name))
    return operations


def test_document_is_valid_openapi_3_1() -> None:
    document = openapi_document(Settings(), ROUTE_ROLES)
    validate_openapi(document)
    assert document["openapi"].startswith("3.1")
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


async def test_every_route_in_the_router_is_documented_and_nothing_else(make_client: ClientFactory) -> None:
    client = await make_client()
    document = await (await client.get("/openapi.json")).json()
    served, documented = set(router_operations(client.app.router)), documented_routes(document)
    assert served - documented == set(), "routes missing from /openapi.json"
    assert documented - served == set(), "documented routes the server does not have"
    assert {name for _, _, name in served} >= ROUTE_ROLES.inference | ROUTE_ROLES.public


SNAPSHOT = TESTS / "data" / "openapi.json"


def test_the_document_is_the_one_committed() -> None:
    """The document with the default settings, as committed: a change to the API (or a refactor
    that meant to change nothing) shows here. When the change is meant, rewrite the file with
    ``python -c 'from tests.unit.api.test_openapi import write_snapshot; write_snapshot()'``."""
    document = json.loads(json.dumps(openapi_document(Settings(), ROUTE_ROLES)))
    assert document == json.loads(SNAPSHOT.read_text(encoding="utf-8")), "the OpenAPI document changed"


def write_snapshot() -> None:
    text = json.dumps(openapi_document(Settings(), ROUTE_ROLES), indent=1, sort_keys=True)
    SNAPSHOT.write_text(text + "\n", encoding="utf-8")


async def test_with_an_api_key_protected_operations_document_and_answer_401(make_client: ClientFactory) -> None:
    client = await make_client(api_key="s3cret")
    response = await client.get("/openapi.json", headers={"Authorization": "Bearer s3cret"})
    document = await response.json()
    validate_openapi(document)
    docs = Conformance(document)
    protected = 0
    for path, item in document["paths"].items():
        for method, operation in item.items():
            url = path.replace("{filename}", "demo.css").replace("{model}", "maskserve").replace("{version}", "1")
            response = await client.request(method, url, allow_redirects=False)
            if {"bearer": []} in operation.get("security", []):
                protected += 1
                await docs.check(response, 401)
            else:
                await docs.check(response)
                assert response.status != 401, (method, path)
    assert protected >= 4  # POST /, POST /demo, /metrics, /info, /openapi.json


async def test_document_carries_the_servers_own_limits_and_request_schema(make_client: ClientFactory) -> None:
    client = await make_client(max_inputs=7, max_top_k=9, max_targets=3, max_text_chars=321, max_body_bytes=5000)
    response = await client.get("/openapi.json")
    assert response.status == 200
    document = await response.json()
    request = document["components"]["schemas"]["FillMaskRequest"]
    # The very schema the parser validates with.
    assert request == request_schema(client.app[SERVICE_KEY].settings)
    assert request["properties"]["inputs"]["oneOf"][1]["maxItems"] == 7
    assert request["properties"]["parameters"]["properties"]["top_k"]["maximum"] == 9
    assert request["properties"]["parameters"]["properties"]["targets"]["oneOf"][2]["maxItems"] == 3
    operation = document["paths"]["/"]["post"]
    assert operation["requestBody"]["content"]["text/plain"]["schema"]["maxLength"] == 321
    assert "5000 bytes" in operation["responses"]["413"]["description"]
    # The example names the served model's own mask token.
    assert "[MASK]" in operation["requestBody"]["content"]["text/plain"]["example"]


async def test_every_documented_response_is_produced_and_matches_the_document(
    make_client: ClientFactory, bert_engine: FillMaskEngine, model_repository: Path, tmp_path: Path
) -> None:
    model = ControlledModel(bert_engine)
    client = await make_client(engine=model, max_queue=2, stall_timeout=0.2, max_body_bytes=4096, body_timeout=0.2)
    document = await (await client.get("/openapi.json")).json()
    docs = Conformance(document)
    paris = "paris is the [MASK] of france."

    # 504 first, while no batch has been measured: the breaker never refuses on a guess.
    model.hold()
    busy = asyncio.create_task(client.post("/", data="the [MASK] barked."))
    await wait_until_entered(model)
    for path in FILL_PATHS:
        await docs.check(await client.post(path, data=paris, headers={"X-Request-Timeout": "0.2"}), 504)
    await docs.check(await client.post("/demo", data={"text": paris}, headers={"X-Request-Timeout": "0.2"}), 504)
    for infer in INFER_PATHS:
        await docs.check(await client.post(infer, json=infer_body(paris), headers={"X-Request-Timeout": "0.2"}), 504)
    # POST /score: two scored tokens, two queued copies (the queue holds two).
    for path in SCORE_PATHS:
        await docs.check(await client.post(path, data="a dog", headers={"X-Request-Timeout": "0.2"}), 504)
    await docs.check(
        await client.post("/demo/score", data={"sentences": "a dog"}, headers={"X-Request-Timeout": "0.2"}), 504
    )
    # A full queue refuses at the door; a pass held past the stall budget fails the probes. (The
    # timed-out requests' slots are freed when the queue reaches its bound: two live ones fill it.)
    batcher = default_parts(client).batcher
    queued = [asyncio.create_task(client.post("/", data="a [MASK] b.")) for _ in range(2)]
    for _ in range(500):  # the timed-out texts discarded, both new ones queued
        # Each fill path's text, the page's, the infer paths', and two copies for each scoring path and the page's.
        if (
            batcher.drops.expired == len(FILL_PATHS) + 1 + len(INFER_PATHS) + 2 * (len(SCORE_PATHS) + 1)
            and batcher.depth == 2
        ):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the queue never held the two new texts")
    for path in FILL_PATHS:
        await docs.check(await client.post(path, data=paris), 503)
    await docs.check(await client.post("/demo", data={"text": paris}), 503)
    for infer in INFER_PATHS:
        await docs.check(await client.post(infer, json=infer_body(paris)), 503)
    for path in SCORE_PATHS:
        await docs.check(await client.post(path, data="a dog"), 503)
    await docs.check(await client.post("/demo/score", data={"sentences": "a dog"}), 503)
    await asyncio.sleep(0.3)
    await docs.check(await client.get("/livez"), 503)
    await docs.check(await client.get("/readyz"), 503)
    for path in ("/v2/health/live", "/v2/health/ready", *(model + "/ready" for model in MODEL_PATHS)):
        await docs.check(await client.get(path), 400)  # the protocol's 4xx for "not healthy"
    model.release()
    for response in await asyncio.gather(busy, *queued):
        await docs.check(response, 200)

    # POST /: both forms, single and several masks, single and several inputs.
    json_headers = {"Content-Type": "application/json"}
    poisoned = "the [MASK] is poisoned."
    model.poisoned.add(bert_engine.encode(poisoned))
    for path in FILL_PATHS:
        await docs.check(await client.post(path, data=paris), 200)
        await docs.check(
            await client.post(path, data="the [MASK] sat on the [MASK].", headers={"X-Request-Id": "r-1"}), 200
        )
        for body in (
            {"inputs": paris},
            {"inputs": [paris, "the [MASK] sat on the [MASK]."], "parameters": {"top_k": 2}},
            {"inputs": [paris], "parameters": {"targets": ["capital", "city"]}},
        ):
            await docs.check(await client.post(path, json=body), 200)
        for data, headers in (
            (b"\xff\xfe [MASK]", {}),
            (b'{"inputs": ', json_headers),
            (paris.encode(), {"X-Request-Timeout": "soon"}),
        ):
            await docs.check(await client.post(path, data=data, headers=headers), 400)
        await docs.check(await client.post(path, data=b"x" * 8192), 413)
        for data, headers in (
            (b"no mask here", {}),
            (json.dumps({"inputs": paris, "model": "/etc/passwd"}).encode(), json_headers),
            (json.dumps({"inputs": paris, "parameters": {"top_k": 0}}).encode(), json_headers),
        ):
            await docs.check(await client.post(path, data=data, headers=headers), 422)
        await docs.check(await client.post(path, data=poisoned), 500)

    # POST /score: raw text and JSON, one and several inputs, with and without tokens.
    model.poisoned.add(
        masked_copies(
            bert_engine.encode_words("the cat"), bert_engine.mask_token_id, "original", Layout.of(bert_engine)
        )
        .copies[0]
        .input_ids
    )
    for path in SCORE_PATHS:
        await docs.check(await client.post(path, data="a dog"), 200)
        for body in (
            {"inputs": "a dog"},
            {"inputs": ["dog", "cat"], "parameters": {"metric": "within_word_l2r", "tokens": True}},
        ):
            await docs.check(await client.post(path, json=body), 200)
        await docs.check(await client.post(path, data=b'{"inputs": ', headers=json_headers), 400)
        await docs.check(await client.post(path, data=b"x" * 8192), 413)
        for body in ({"inputs": ""}, {"inputs": "a dog", "parameters": {"metric": "l2r"}}, {"inputs": paris}):
            await docs.check(await client.post(path, json=body), 422)
        await docs.check(await client.post(path, data="the cat"), 500)
    # A body that stops arriving, on every operation that reads one.
    body_types = [(p, "text/plain") for p in (*FILL_PATHS, *SCORE_PATHS)] + [
        (p, "application/json") for p in INFER_PATHS
    ]
    for path, content_type in [
        *body_types,
        *((p, "application/x-www-form-urlencoded") for p in ("/demo", "/demo/score")),
    ]:
        status, headers, body = await body_that_stops(client, path, content_type)
        assert status == 408 and json.loads(body)["error_type"] == "body_timeout", (path, status, body)
        docs.check_parts("POST", path, status, headers, body)
    # A name no model is served under.
    await docs.check(await client.post("/models/bert", data=paris), 404)
    await docs.check(await client.post("/models/bert/score", data="a dog"), 404)

    # The demo page.
    await docs.check(await client.get("/", params={"text": paris}), 200)
    await docs.check(await client.post("/demo", data={"text": paris, "top_k": "3"}), 200)
    await docs.check(await client.post("/demo", data={"text": "no mask"}), 422)
    await docs.check(await client.post("/demo", data={"text": poisoned}), 500)
    await docs.check(await client.post("/demo", data={"text": "x" * 8192}), 413)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    await docs.check(await client.post("/demo", data=b"text=caf\xe9+[MASK]", headers=form), 400)
    await docs.check(await client.get("/demo", params={"text": paris}, allow_redirects=False), 303)
    # Its scoring form.
    await docs.check(await client.post("/demo/score", data={"sentences": "dog\ncat"}), 200)
    await docs.check(await client.post("/demo/score", data={"sentences": "a dog", "metric": "l2r"}), 422)
    await docs.check(await client.post("/demo/score", data={"sentences": "the cat"}), 500)
    await docs.check(await client.post("/demo/score", data={"sentences": "x" * 8192}), 413)
    await docs.check(await client.post("/demo/score", data=b"sentences=caf\xe9", headers=form), 400)
    await docs.check(await client.get("/demo/score", allow_redirects=False), 303)
    await docs.check(await client.get("/static/demo.css"), 200)
    await docs.check(await client.get("/static/demo.js"), 200)
    await docs.check(await client.get("/static/no-such-file.css"), 404)

    # Operations.
    for path in ("/livez", "/readyz", "/metrics", "/info", "/openapi.json"):
        await docs.check(await client.get(path), 200)

    # The Open Inference Protocol, each model route with and without the version segment.
    for path in ("/v2", "/v2/", "/v2/health/live", "/v2/health/ready"):
        await docs.check(await client.get(path), 200)
    for model in MODEL_PATHS:
        await docs.check(await client.get(model), 200)
        await docs.check(await client.get(model + "/ready"), 200)
    for model in ("/v2/models/bert", "/v2/models/maskserve/versions/2", "/v2/models/bert/versions/1"):
        await docs.check(await client.get(model), 404)
        await docs.check(await client.get(model + "/ready"), 400)  # not ready, as Triton answers
        await docs.check(await client.post(model + "/infer", json=infer_body(paris)), 404)
    for infer in INFER_PATHS:
        await docs.check(await client.post(infer, json=infer_body(paris, "the [MASK] sat on the [MASK].")), 200)
        binary = infer_body(paris) | {"parameters": {"binary_data_output": True}}
        answered = await docs.check(await client.post(infer, json=binary), 200)
        assert answered.headers["Content-Type"] == "application/octet-stream"
        await docs.check(await client.post(infer, data=b'{"inputs": ', headers=json_headers), 400)
        await docs.check(await client.post(infer, data=b"x" * 8192, headers=json_headers), 413)
        await docs.check(await client.post(infer, json=infer_body("no mask")), 422)
        await docs.check(await client.post(infer, json=infer_body(poisoned)), 500)

    await produce_repository_responses(docs, make_client, model_repository, tmp_path)
    missing = docs.documented() - docs.seen
    assert not missing, f"documented but never produced (the document claims too much): {sorted(missing)}"


async def produce_repository_responses(
    docs: Conformance, make_client: ClientFactory, repository: Path, tmp_path: Path
) -> None:
    """The model repository's routes: off (--model-control-mode none), then each status they answer."""
    index, load, unload = "/v2/repository/index", "/v2/repository/models/beta/load", "/v2/repository/models/beta/unload"
    for path in (index, load, unload):
        await docs.check(await (await make_client()).post(path), 404)
    padded = tmp_path / "padded"
    shutil.copytree(repository, padded)
    with open(padded / "gamma" / "padding.bin", "wb") as padding:
        padding.truncate(2**31)
    client = await make_client(
        model_repository=str(padded), model_control_mode="explicit", control_key=CONTROL_KEY, models_memory="1GiB"
    )
    control = {"Authorization": f"Bearer {CONTROL_KEY}"}
    json_headers = {"Content-Type": "application/json", **control}
    await docs.check(await client.post(index), 200)
    await docs.check(await client.post(index, data=b"{", headers=json_headers), 400)
    await docs.check(await client.post(index, json={"ready": 1}), 422)
    for path in (load, unload):
        await docs.check(await client.post(path), 401)
        await docs.check(await client.post(path, headers={"Authorization": "Bearer not-the-control-key-000"}), 403)
        await docs.check(await client.post(path.replace("beta", "nosuch"), headers=control), 404)
        await docs.check(await client.post(path, data=b"{", headers=json_headers), 400)
        await docs.check(await client.post(path, json={"parameters": []}, headers=control), 422)
        await docs.check(await client.post(path, headers=control), 200)
    bad_config = {"parameters": {"config": json.dumps({"max_batch_size": 0})}}
    await docs.check(await client.post(load, json=bad_config, headers=control), 400)
    (padded / "beta" / "maskserve.yaml").write_text("max_batch_size: 0\n", encoding="utf-8")
    await docs.check(await client.post(load, headers=control), 409)
    (padded / "beta" / "maskserve.yaml").unlink()
    (padded / "beta" / "config.json").write_text('{"model_type": "nosuch"}', encoding="utf-8")
    await docs.check(await client.post(load, headers=control), 500)
    await docs.check(await client.post(load.replace("beta", "gamma"), headers=control), 507)
