"""Several models in one server: each answers like its own pipeline on every route that names it,
and one flooded model cannot starve another. Through the real loading code and the real HTTP stack
(the fairness check through ``python -m maskserve``)."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import transformers
from aiohttp import web
from aiohttp.test_utils import TestClient
from huggingface_hub import InferenceClient
from prometheus_client.parser import text_string_to_metric_families

from maskserve.config.settings import Settings
from maskserve.http.app import create_app
from tests.live_server import maskserve_process, run_maskserve
from tests.unit.api.test_views import hub_reaches_localhost  # noqa: F401 - a fixture, used by name

# Three architectures and three tokenizers: WordPiece, byte-level BPE, SentencePiece Unigram.
NAMES = ("bert", "roberta", "xlmr")
TEXT = "paris is the {mask} of france."


@pytest.fixture(scope="module")
def folders(bert_dir: Path, roberta_dir: Path, xlmr_dir: Path) -> dict[str, Path]:
    return {"bert": bert_dir, "roberta": roberta_dir, "xlmr": xlmr_dir}


@pytest.fixture(scope="module")
def pipelines(folders: dict[str, Path]) -> dict[str, Any]:
    return {
        name: transformers.pipeline("fill-mask", model=str(folder), device="cpu") for name, folder in folders.items()
    }


@pytest.fixture
async def client(
    aiohttp_client: Any, folders: dict[str, Path]
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    # Loaded by the server itself, on its inference thread, as `maskserve --model NAME=DIR ...` does.
    settings = Settings(model=tuple(f"{name}={folder}" for name, folder in folders.items()), warmup=False)
    yield await aiohttp_client(create_app(settings))


def text_for(pipe: Any) -> str:
    return TEXT.format(mask=pipe.tokenizer.mask_token)


def assert_like_pipeline(answer: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert [(p["token"], p["token_str"], p["sequence"]) for p in answer] == [
        (p["token"], p["token_str"], p["sequence"]) for p in expected
    ]
    assert [p["score"] for p in answer] == pytest.approx([p["score"] for p in expected], abs=1e-5)


async def test_each_model_answers_like_its_own_pipeline_on_its_route_and_the_oip(
    client: TestClient[web.Request, web.Application], pipelines: dict[str, Any]
) -> None:
    for name, pipe in pipelines.items():
        text = text_for(pipe)
        expected = pipe(text, top_k=5)
        response = await client.post(f"/models/{name}", data=text)
        assert response.status == 200, await response.text()
        assert_like_pipeline(await response.json(), expected)
        # As the pipeline reads targets: a word outside the vocabulary stands for its first token.
        parameters = {"top_k": 2, "targets": ["capital", "city"], "multi_token_targets": "first_token"}
        targets = {"inputs": text, "parameters": parameters}
        response = await client.post(f"/models/{name}", json=targets)
        assert_like_pipeline(await response.json(), pipe(text, top_k=2, targets=["capital", "city"]))
        for infer in (f"/v2/models/{name}/infer", f"/v2/models/{name}/versions/1/infer"):
            body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}
            response = await client.post(infer, json=body)
            assert response.status == 200, await response.text()
            answer = await response.json()
            assert answer["model_name"] == name
            assert_like_pipeline(json.loads(answer["outputs"][0]["data"][0]), expected)
        metadata = await (await client.get(f"/v2/models/{name}")).json()
        assert metadata["parameters"]["mask_token"] == pipe.tokenizer.mask_token


async def test_the_first_model_is_the_default_of_post_root_and_score(
    client: TestClient[web.Request, web.Application], pipelines: dict[str, Any]
) -> None:
    text = text_for(pipelines["bert"])
    assert_like_pipeline(await (await client.post("/", data=text)).json(), pipelines["bert"](text, top_k=5))
    scores = {}
    for path in ("/score", *(f"/models/{name}/score" for name in NAMES)):
        response = await client.post(path, data="the dog barked.")
        assert response.status == 200, await response.text()
        scores[path] = (await response.json())["score"]
    assert scores["/score"] == scores["/models/bert/score"]
    assert len({scores[f"/models/{name}/score"] for name in NAMES}) == 3  # three models, three scores


@pytest.mark.usefixtures("hub_reaches_localhost")
async def test_the_inference_client_reaches_each_model_at_its_base_url(
    client: TestClient[web.Request, web.Application], pipelines: dict[str, Any]
) -> None:
    for name, pipe in pipelines.items():
        hub = InferenceClient(base_url=str(client.make_url(f"/models/{name}")))
        text = text_for(pipe)
        answer = await asyncio.to_thread(hub.fill_mask, text, top_k=3)
        assert [(a.token, a.token_str, a.sequence) for a in answer] == [
            (p["token"], p["token_str"], p["sequence"]) for p in pipe(text, top_k=3)
        ]


async def test_an_unknown_model_is_a_404_naming_the_served_ones(
    client: TestClient[web.Request, web.Application],
) -> None:
    for method, path in (
        ("POST", "/models/gpt"),
        ("POST", "/models/gpt/score"),
        ("POST", "/v2/models/gpt/infer"),
        ("GET", "/v2/models/gpt"),
    ):
        response = await client.request(method, path, data="a [MASK] b.")
        assert response.status == 404, path
        body = await response.json()
        assert body["error_type"] == "not_found" and body["request_id"]
        assert "'gpt'" in body["error"] and "'bert', 'roberta', 'xlmr'" in body["error"], body
    # Readiness answers as Triton does: not ready (400), which its clients read as False, naming why.
    ready = await client.get("/v2/models/gpt/ready")
    assert ready.status == 400 and "'bert', 'roberta', 'xlmr'" in await ready.text()


async def test_info_and_metrics_name_every_model(client: TestClient[web.Request, web.Application]) -> None:
    for name in NAMES:
        assert (await client.post(f"/models/{name}/score", data="a dog.")).status == 200
    info = await (await client.get("/info")).json()
    assert [m["name"] for m in info["models"]] == list(NAMES)
    assert [m["architecture"] for m in info["models"]] == [
        "BertForMaskedLM",
        "RobertaForMaskedLM",
        "XLMRobertaForMaskedLM",
    ]
    assert {m["backend"] for m in info["models"]} == {"torch"}
    assert all(m["limits"]["max_inputs"] == 64 and m["max_queue"] == 4096 for m in info["models"])
    assert info["model"]["name"] == "bert"  # the default
    exposition = await (await client.get("/metrics")).text()
    labelled: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if "model" in sample.labels:
                labelled.setdefault(family.name, set()).add(sample.labels["model"])
    for family in (
        "maskserve_queue_depth",
        "maskserve_queue_limit",
        "maskserve_refused_requests",
        "maskserve_model_info",
    ):
        assert labelled[family] == set(NAMES), family
    for family in ("maskserve_requests", "maskserve_queue_wait_seconds", "maskserve_batch_size"):
        assert set(NAMES) <= labelled[family], family


def test_a_model_that_cannot_load_stops_the_start_naming_it(bert_dir: Path, tmp_path: Path) -> None:
    result = run_maskserve("--model", f"good={bert_dir}", "--model", f"broken={tmp_path}", "--no-warmup")
    assert result.returncode == 1, result.stderr
    assert "model 'broken'" in result.stderr


def models_file(tmp_path: Path, flooded: Path, quiet: Path) -> Path:
    path = tmp_path / "models.yaml"
    # The flooded model takes one text a pass, so its queue is as many passes deep as it holds texts.
    path.write_text(
        f"""models:
  - name: flooded
    source: {flooded}
    max_batch_size: 1
    max_queue: 64
  - name: quiet
    source: {quiet}
""",
        encoding="utf-8",
    )
    return path


async def flood(session: aiohttp.ClientSession, url: str, text: str, stop: asyncio.Event) -> list[tuple[int, float]]:
    """One flooding client: posts until told to stop (or 400 requests); its (status, seconds)."""
    seen: list[tuple[int, float]] = []
    while not stop.is_set() and len(seen) < 400:
        started = time.perf_counter()
        async with session.post(url, data=text) as response:
            await response.read()
            seen.append((response.status, time.perf_counter() - started))
        if response.status == 503:
            await asyncio.sleep(0.01)  # refused at the door: a polite client would wait Retry-After
    return seen


async def test_a_flooded_model_cannot_starve_a_quiet_one(bert_dir: Path, roberta_dir: Path, tmp_path: Path) -> None:
    path = models_file(tmp_path, bert_dir, roberta_dir)
    with maskserve_process("--models-file", str(path), log_dir=tmp_path) as server:
        async with aiohttp.ClientSession() as session:
            stop = asyncio.Event()
            flooders = [
                asyncio.create_task(flood(session, f"{server.url}/models/flooded", "the [MASK] barked.", stop))
                for _ in range(96)  # more than its queue holds
            ]
            await asyncio.sleep(2.0)  # the flooded model's queue fills
            quiet: list[tuple[int, float]] = []
            for _ in range(40):
                started = time.perf_counter()
                async with session.post(f"{server.url}/models/quiet", data="the <mask> barked.") as response:
                    await response.read()
                    quiet.append((response.status, time.perf_counter() - started))
            stop.set()
            flooded = [seen for task in flooders for seen in await task]
    assert [status for status, _ in quiet] == [200] * len(quiet)
    assert any(status == 503 for status, _ in flooded), "the flooded model was never past its queue"
    flooded_ok = [seconds for status, seconds in flooded if status == 200]
    quiet_p50 = statistics.median(seconds for _, seconds in quiet)
    flooded_p50 = statistics.median(flooded_ok)
    assert quiet_p50 <= flooded_p50 / 4, (quiet_p50, flooded_p50)
