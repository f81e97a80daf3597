"""Prometheus metrics: one registry per app, fed by the request middleware and the batcher.

Each app owns a :class:`prometheus_client.CollectorRegistry` (never the process-global one), so
several apps in one process, as in the tests, keep separate counts. Request figures come from
``middleware/metrics.py``, batch figures from a batcher listener (on the event loop, once per
forward pass), and the live state (queue depth, drops, refusals) is read at scrape time, so it
can never drift from the batcher's own counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from . import __version__
from .admission import Admission
from .batcher import Batcher
from .connections import CLOSE_REASONS, ConnectionGuard
from .costs import ONE_TEXT, BatchReport
from .model_api import describe_model
from .work_queue import Answer

# Seconds, from a cache-warm small model (about a millisecond) to the default deadline and past it.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

# Every refusal reason admission counts, exported at 0 before the first one happens, so that
# rate() and alerts see the series from the start.
REFUSAL_REASONS = ("queue_full", "predicted_timeout", "shutting_down")


class Metrics:
    """The app's metric objects and its registry; :meth:`attach` it to the batcher once started."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "maskserve_requests",
            "HTTP requests answered, by route, status code and kind (ok or the error kind).",
            ["route", "status", "kind"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "maskserve_request_duration_seconds",
            "Time from the request reaching the app to its response, by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_wait_seconds = Histogram(
            "maskserve_queue_wait_seconds",
            "Time each answered text waited in the queue before its forward pass started.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.inference_seconds = Histogram(
            "maskserve_inference_duration_seconds",
            "Time of each forward pass (one batch) on the inference thread.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "maskserve_batch_size",
            "Texts in each forward pass.",
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.batch_padded_tokens = Histogram(
            "maskserve_batch_padded_tokens",
            "Tokens each forward pass computed: texts x longest text, padding included.",
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.batch_padding_ratio = Histogram(
            "maskserve_batch_padding_ratio",
            "Share of each forward pass spent on padding: 1 - real tokens / padded tokens.",
            buckets=RATIO_BUCKETS,
            registry=registry,
        )
        self.busy_seconds = Counter(
            "maskserve_inference_busy_seconds",
            "Seconds the inference thread spent in forward passes, counted when each pass ends. "
            "rate() of it is the thread's busy ratio.",
            registry=registry,
        )
        self.failed_texts = Counter(
            "maskserve_inference_failed_texts",
            "Texts the model failed on, after isolating them from their batch (500 inference_failed).",
            registry=registry,
        )
        self.model_info = Info(
            "maskserve_model",
            "The model served and how it runs (labels); the value is always 1.",
            registry=registry,
        )
        self._state = _ServingState()
        registry.register(self._state)
        # The process's own figures (start time, CPU, memory, open files), on this app's registry:
        # a restart shows as a new start time, not only as counters that fell back to zero.
        ProcessCollector(registry=registry)

    def watch_connections(self, guard: ConnectionGuard) -> None:
        """Export the client connections' figures, read from ``guard`` at scrape time."""
        self.registry.register(_ConnectionState(guard))

    def attach(
        self,
        batcher: Batcher,
        admission: Admission | None = None,
        model_name: str | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        """Start observing ``batcher``'s batches, and export its state (and admission's) at scrape time.

        ``model_name`` is the name clients use (``--model-name``); the model's own, its source, is a
        label too. ``ready`` is the readiness probe's own verdict, handed down by the layer that
        owns it, so the gauge and ``/readyz`` can never disagree.
        """
        batcher.listeners.append(self.observe_batch)
        self._state.batcher = batcher
        self._state.admission = admission
        self._state.ready = ready
        description = describe_model(batcher.model)
        load_seconds = description.get("load_seconds")
        self._state.load_seconds = float(load_seconds) if isinstance(load_seconds, int | float) else None
        self.model_info.info(
            {
                "name": model_name or batcher.model.name,
                "source": str(description.get("source", batcher.model.name)),
                "mask_token": batcher.model.mask_token,
                "device": str(description.get("device", "unknown")),
                "dtype": str(description.get("dtype", "unknown")),
                "maskserve_version": __version__,
            }
        )

    def observe_batch(self, report: BatchReport) -> None:
        """Batcher listener: one call per forward pass, on the event loop."""
        self.inference_seconds.observe(report.seconds)
        self.busy_seconds.inc(report.seconds)
        self.batch_size.observe(report.size)
        self.batch_padded_tokens.observe(report.padded_tokens)
        if report.padded_tokens > 0:
            self.batch_padding_ratio.observe(1.0 - report.real_tokens / report.padded_tokens)
        if report.failed:
            self.failed_texts.inc(report.failed)

    def observe_answers(self, answers: Sequence[Answer]) -> None:
        """Queue waits of one request's answered texts."""
        for answer in answers:
            self.queue_wait_seconds.observe(answer.queued_s)

    def observe_request(self, route: str, status: int, kind: str, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status), kind=kind).inc()
        self.request_seconds.labels(route=route).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The registry in Prometheus text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _ServingState(Collector):
    """Figures read from the batcher and admission when scraped, so they never drift from them."""

    def __init__(self) -> None:
        self.batcher: Batcher | None = None
        self.admission: Admission | None = None
        self.ready: Callable[[], bool] | None = None
        self.load_seconds: float | None = None

    def collect(self) -> Iterator[Metric]:
        batcher = self.batcher
        if batcher is None:  # the model is not loaded yet
            return
        if self.ready is not None:
            yield GaugeMetricFamily(
                "maskserve_ready",
                "1 while /readyz answers 200 (loaded, not draining, not stuck), else 0; never load.",
                value=1.0 if self.ready() else 0.0,
            )
        yield GaugeMetricFamily("maskserve_queue_depth", "Texts waiting for the model now.", value=batcher.depth)
        yield GaugeMetricFamily(
            "maskserve_queue_limit", "Most texts that may wait (--max-queue).", value=batcher.settings.max_queue
        )
        yield GaugeMetricFamily(
            "maskserve_predicted_wait_seconds",
            "Predicted wait for one more text now, from the measured cost; admission refuses at the door by it.",
            value=batcher.predicted_wait(ONE_TEXT),
        )
        yield GaugeMetricFamily(
            "maskserve_inference_in_flight_seconds",
            "How long the forward pass in flight has been running; 0 when idle (/livez compares it "
            "with the stall budget).",
            value=batcher.busy_for,
        )
        dropped = CounterMetricFamily(
            "maskserve_dropped_texts",
            "Texts removed from the queue without a forward pass: deadline passed or sure to pass "
            "(expired), or client gone (abandoned).",
            labels=["reason"],
        )
        dropped.add_metric(["expired"], batcher.drops.expired)
        dropped.add_metric(["abandoned"], batcher.drops.abandoned)
        yield dropped
        if self.admission is not None:
            refused = CounterMetricFamily(
                "maskserve_refused_requests",
                "Requests admission refused with 503, at the door or once parsed, by reason.",
                labels=["reason"],
            )
            counts = self.admission.refused
            for reason in sorted(set(REFUSAL_REASONS) | set(counts)):
                refused.add_metric([reason], counts[reason])
            yield refused
        if self.load_seconds is not None:
            yield GaugeMetricFamily(
                "maskserve_model_load_seconds", "Seconds the model took to load at start-up.", value=self.load_seconds
            )


class _ConnectionState(Collector):
    """The client connections, read from the connection guard when scraped."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        guard = self.guard
        yield GaugeMetricFamily(
            "maskserve_open_connections", "Client connections open now (--max-connections).", value=len(guard.open)
        )
        yield GaugeMetricFamily(
            "maskserve_unsent_bytes",
            "Bytes of answers written but not yet taken by their clients (--max-unsent-bytes).",
            value=guard.unsent_bytes(),
        )
        closed = CounterMetricFamily(
            "maskserve_closed_connections",
            "Connections the server closed, by reason: header_timeout, body_timeout, write_timeout, "
            "unsent_bytes (the slowest readers, past --max-unsent-bytes), idle (keep-alive), "
            "connection_limit (refused past --max-connections).",
            labels=["reason"],
        )
        for reason in sorted(set(CLOSE_REASONS) | set(guard.closed)):
            closed.add_metric([reason], guard.closed[reason])
        yield closed


class Peers(Protocol):
    """The other processes of one server (``--workers``): a scrape of any of them reports all."""

    # This process's label value: the worker's slot, "0" to "N-1", stable across its restarts.
    worker: str

    async def expositions(self) -> list[tuple[str, bytes]]:
        """(worker, its own exposition) of every other live worker; a worker that does not
        answer in time is left out."""
        ...


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def merge_expositions(parts: Sequence[tuple[str, bytes]]) -> bytes:
    """One exposition of several workers' own, each sample labelled ``worker``: per-worker series
    in one scrape, which ``sum by (...)`` adds up to the whole server."""
    families: dict[str, Metric] = {}
    for worker, text in parts:
        for family in text_string_to_metric_families(text.decode("utf-8")):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            merged.samples.extend(
                sample._replace(labels={**sample.labels, "worker": worker}) for sample in family.samples
            )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families.values()))
    return generate_latest(registry)
