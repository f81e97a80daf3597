"""/metrics through the real app: the exposition parses, moves with traffic, and stays per app."""

from __future__ import annotations

import asyncio
import math
import re

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from maskserve.engine import FillMaskEngine
from maskserve.observability.metrics import Metrics
from maskserve.request.keys import SERVICE_KEY
from maskserve.serving.costs import BatchReport
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts, holding, wait_for_depth, wait_until_entered
from tests.paths import ROOT

Client = TestClient[web.Request, web.Application]
# (sample name, sorted label pairs) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def scrape(client: Client) -> Samples:
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
    return parse(await response.text())


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry ``labels`` (and any others), as PromQL's sum() would."""
    wanted = set(labels.items())
    return sum(v for (sample, sample_labels), v in samples.items() if sample == name and wanted <= set(sample_labels))


async def test_idle_exposition_declares_every_metric_with_its_type(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.get("/metrics")
    assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
    families = {family.name: family.type for family in text_string_to_metric_families(await response.text())}
    assert {
        "maskserve_requests": "counter",
        "maskserve_request_duration_seconds": "histogram",
        "maskserve_queue_wait_seconds": "histogram",
        "maskserve_inference_duration_seconds": "histogram",
        "maskserve_batch_size": "histogram",
        "maskserve_batch_padded_tokens": "histogram",
        "maskserve_batch_padding_ratio": "histogram",
        "maskserve_inference_busy_seconds": "counter",
        "maskserve_inference_failed_texts": "counter",
        "maskserve_dropped_texts": "counter",
        "maskserve_refused_requests": "counter",
        "maskserve_queue_depth": "gauge",
        "maskserve_queue_limit": "gauge",
        "maskserve_predicted_wait_seconds": "gauge",
        "maskserve_inference_in_flight_seconds": "gauge",
        "maskserve_model_load_seconds": "gauge",
        "maskserve_model_info": "gauge",  # an Info metric: its labels describe the model
        "maskserve_ready": "gauge",
        "process_start_time_seconds": "gauge",
    }.items() <= families.items()


async def test_the_ready_gauge_follows_readyz_and_never_load(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, max_queue=1, max_inputs=1)
    assert value(await scrape(client), "maskserve_ready") == 1
    async with holding(client, model, queued=["b [MASK]"]) as held:
        assert (await client.post("/", data="c [MASK]")).status == 503  # shedding...
        assert value(await scrape(client), "maskserve_ready") == 1  # ...is not unready
        client.app[SERVICE_KEY].lifecycle.start_draining()
        assert value(await scrape(client), "maskserve_ready") == 0
        assert (await client.get("/readyz")).status == 503  # the same verdict
    assert await held.statuses() == [200, 200]


async def test_traffic_moves_request_queue_batch_and_busy_metrics(make_client: ClientFactory) -> None:
    client = await make_client(max_queue=64)
    before = await scrape(client)
    texts = ["paris is the [MASK] of france.", "the [MASK] is red.", "a [MASK] of a longer sentence is here."]
    for text in texts:
        assert (await client.post("/", data=text)).status == 200
    assert (await client.post("/", json={"inputs": ["one [MASK].", "two [MASK] words."]})).status == 200
    assert (await client.post("/", data="no mask here")).status == 422
    after = await scrape(client)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("maskserve_requests_total", route="fill_mask", status="200", kind="ok") == 4
    assert grew("maskserve_requests_total", route="fill_mask", status="422", kind="no_mask_token") == 1
    assert grew("maskserve_request_duration_seconds_count", route="fill_mask") == 5
    assert grew("maskserve_request_duration_seconds_sum", route="fill_mask") > 0
    # Five texts were answered: each waited once, each ran in exactly one batch.
    assert grew("maskserve_queue_wait_seconds_count") == 5
    assert grew("maskserve_batch_size_sum") == 5
    batches = grew("maskserve_inference_duration_seconds_count")
    assert 1 <= batches <= 5
    assert grew("maskserve_batch_size_count") == batches
    assert grew("maskserve_batch_padding_ratio_count") == batches
    assert grew("maskserve_batch_padded_tokens_sum") >= 5 * 4  # every text is a few tokens at least
    assert grew("maskserve_inference_busy_seconds_total") > 0
    assert grew("maskserve_inference_busy_seconds_total") == grew("maskserve_inference_duration_seconds_sum")
    assert value(after, "maskserve_queue_depth") == 0
    assert value(after, "maskserve_inference_in_flight_seconds") == 0
    # The scrape before this one was counted as a request too.
    assert grew("maskserve_requests_total", route="metrics", status="200", kind="ok") == 1


async def test_model_load_time_and_info_are_exported(make_client: ClientFactory, bert_engine: FillMaskEngine) -> None:
    client = await make_client(model_name="support-bert")  # the tiny BERT, loaded by load_engine
    samples = await scrape(client)
    assert value(samples, "maskserve_model_load_seconds") > 0
    info = [labels for name, labels in samples if name == "maskserve_model_info"]
    assert len(info) == 1
    assert dict(info[0])["mask_token"] == "[MASK]"
    assert dict(info[0])["device"] == "cpu"
    assert dict(info[0])["name"] == "support-bert"  # --model-name
    assert dict(info[0])["source"] == bert_engine.name


async def test_each_app_counts_only_its_own_traffic(make_client: ClientFactory) -> None:
    busy = await make_client()
    quiet = await make_client()
    for _ in range(3):
        assert (await busy.post("/", data="the [MASK] is red.")).status == 200
    assert value(await scrape(busy), "maskserve_batch_size_sum") == 3
    quiet_samples = await scrape(quiet)
    assert value(quiet_samples, "maskserve_requests_total", route="fill_mask", status="200", kind="ok") == 0
    assert value(quiet_samples, "maskserve_batch_size_sum") == 0


async def test_expired_abandoned_and_refused_requests_are_counted(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, max_queue=3)
    batcher = default_parts(client).batcher
    model.hold()
    try:
        busy = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        # Expired: its deadline passes while it waits behind the held pass (504). Not so short that
        # it could pass before the refused one below is weighed, freeing its slot in the queue.
        late = asyncio.create_task(client.post("/", data="late [MASK]", headers={"X-Request-Timeout": "2"}))
        # Abandoned: its client gives up and closes the connection (handler cancelled).
        async with aiohttp.ClientSession() as other:
            leaver = asyncio.create_task(other.post(client.make_url("/"), data="leaver [MASK]"))
            waiting = asyncio.create_task(client.post("/", data="stayer [MASK]"))
            await wait_for_depth(batcher, 3)
            # Refused at the door: the queue holds 3 texts, its bound.
            refused = await client.post("/", data="refused [MASK]")
            assert refused.status == 503
            leaver.cancel()
            await asyncio.gather(leaver, return_exceptions=True)
        assert (await late).status == 504
    finally:
        model.release()
    assert (await busy).status == 200
    assert (await waiting).status == 200
    samples = await scrape(client)
    # The batch loop swept both dead entries before running the stayer: none cost a pass.
    assert value(samples, "maskserve_dropped_texts_total", reason="expired") == 1
    assert value(samples, "maskserve_dropped_texts_total", reason="abandoned") == 1
    assert value(samples, "maskserve_refused_requests_total", reason="queue_full") == 1
    assert value(samples, "maskserve_refused_requests_total", reason="predicted_timeout") == 0
    assert value(samples, "maskserve_requests_total", route="fill_mask", status="503", kind="overloaded") == 1
    assert value(samples, "maskserve_requests_total", route="fill_mask", status="504", kind="timeout") == 1
    assert value(samples, "maskserve_requests_total", route="fill_mask", status="499", kind="client_closed") == 1


async def test_inference_response_carries_timing_headers_and_request_id(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/", json={"inputs": ["the [MASK] is red.", "the [MASK] is blue."]})
    assert response.status == 200
    queued_ms = float(response.headers["X-Queue-Time-Ms"])
    inference_ms = float(response.headers["X-Inference-Time-Ms"])
    assert math.isfinite(queued_ms) and queued_ms >= 0
    assert math.isfinite(inference_ms) and inference_ms > 0
    assert 1 <= int(response.headers["X-Batch-Size"]) <= 2
    assert response.headers["X-Request-Id"]
    own = await client.post("/", data="the [MASK] is red.", headers={"X-Request-Id": "probe-42"})
    assert own.headers["X-Request-Id"] == "probe-42"


def test_padding_ratio_is_the_share_of_padded_tokens_that_were_padding() -> None:
    metrics = Metrics()
    metrics.observe_batch(BatchReport(size=2, real_tokens=6, padded_tokens=8, seconds=0.5, failed=1), "maskserve")
    samples = parse(metrics.exposition()[0].decode())
    assert value(samples, "maskserve_batch_padding_ratio_sum") == 0.25
    assert value(samples, "maskserve_batch_padded_tokens_sum") == 8
    assert value(samples, "maskserve_batch_size_sum") == 2
    assert value(samples, "maskserve_inference_busy_seconds_total") == 0.5
    assert value(samples, "maskserve_inference_failed_texts_total") == 1


async def test_every_exported_metric_is_in_the_operations_pages_table(make_client: ClientFactory) -> None:
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = page.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(maskserve_\w+)` \|", section, flags=re.MULTILINE))
    client = await make_client()
    assert (await client.post("/", data="the [MASK] is red.")).status == 200
    response = await client.get("/metrics")
    exported = set()
    for family in text_string_to_metric_families(await response.text()):
        if family.name.endswith("_created") or family.name.startswith("process_"):
            continue  # prometheus_client's creation timestamps and process figures, not metrics of ours
        exported.add(family.name + "_total" if family.type == "counter" else family.name)
    assert exported == documented
    assert "`process_*`" in section  # documented as a family


async def test_score_requests_are_counted_under_their_own_route(make_client: ClientFactory) -> None:
    client = await make_client()
    assert (await client.post("/score", data="a dog")).status == 200
    assert (await client.post("/score", json={"inputs": ""})).status == 422
    samples = await scrape(client)
    assert value(samples, "maskserve_requests_total", route="score", status="200", kind="ok") == 1
    assert value(samples, "maskserve_requests_total", route="score", status="422", kind="invalid_input") == 1
