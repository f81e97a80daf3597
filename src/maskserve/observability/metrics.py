"""Prometheus metrics: one registry per app, fed by the request middleware and the batchers.

Every series about a model's work (requests, queue, batches, refusals) is labelled ``model``, the
name clients use for it; a request that named no served model (a probe, an unknown name) has
``model=""``, so that a client cannot make new series by inventing names.

Each app owns a :class:`prometheus_client.CollectorRegistry` (never the process-global one), so
several apps in one process, as in the tests, keep separate counts. Request figures come from
``middleware/request_metrics.py``, batch figures from a batcher listener (on the event loop, once per
forward pass), and the live state (queue depth, drops, refusals) is read at scrape time
(``live_state.py``), so it can never drift from the batcher's own counters. With ``--workers``,
one scrape reports every worker (``peers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)

from maskserve import __version__
from maskserve.model_api import describe_model
from maskserve.observability.live_state import ConnectionState, Lane, ModelsState, ServingState

# They live in live_state.py and peers.py; "as" names them here too, for the modules that import them from here.
from maskserve.serving.admission import Admission
from maskserve.serving.batcher import Batcher
from maskserve.serving.connection_guard import ConnectionGuard
from maskserve.serving.costs import BatchReport
from maskserve.serving.work_queue import Answer

# Seconds, from a cache-warm small model (about a millisecond) to the default deadline and past it.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# Windows a text is read in: 1 for a text the model reads whole; a text at --max-text-tokens takes a few
# (one per group of asked positions), a long text scored takes one per half window or so.
WINDOW_BUCKETS = (1, 2, 3, 4, 6, 8, 16, 32, 64)


class Metrics:
    """The app's metric objects and its registry; :meth:`attach` it to the batcher once started."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "maskserve_requests",
            "Requests answered, by protocol (http or grpc), route (an HTTP route's name or a gRPC "
            "method), status code (HTTP's, or its equivalent for a gRPC status), kind (ok or the "
            "error kind) and model.",
            ["protocol", "route", "status", "kind", "model"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "maskserve_request_duration_seconds",
            "Time from the request reaching the app to its response, by protocol, route and model.",
            ["protocol", "route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_wait_seconds = Histogram(
            "maskserve_queue_wait_seconds",
            "Time each answered text waited in its model's queue before its forward pass started.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.inference_seconds = Histogram(
            "maskserve_inference_duration_seconds",
            "Time of each forward pass (one batch, of one model) on the inference thread.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "maskserve_batch_size",
            "Texts in each forward pass.",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.batch_padded_tokens = Histogram(
            "maskserve_batch_padded_tokens",
            "Tokens each forward pass computed: texts x longest text, padding included.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.batch_padding_ratio = Histogram(
            "maskserve_batch_padding_ratio",
            "Share of each forward pass spent on padding: 1 - real tokens / padded tokens.",
            ["model"],
            buckets=RATIO_BUCKETS,
            registry=registry,
        )
        self.text_windows = Histogram(
            "maskserve_text_windows",
            "Windows each answered text was read in, by model: 1 for a text the model reads whole, more "
            "for a longer one (one per group of masks or scored tokens that share a window).",
            ["model"],
            buckets=WINDOW_BUCKETS,
            registry=registry,
        )
        self.busy_seconds = Counter(
            "maskserve_inference_busy_seconds",
            "Seconds the inference thread spent in forward passes, counted when each pass ends. "
            "rate() of it is the thread's busy ratio (summed over models: the thread is shared).",
            ["model"],
            registry=registry,
        )
        self.failed_texts = Counter(
            "maskserve_inference_failed_texts",
            "Texts the model failed on, after isolating them from their batch (500 inference_failed).",
            ["model"],
            registry=registry,
        )
        self.model_info = Info(
            "maskserve_model",
            "Each model served and how it runs (labels); the value is always 1.",
            ["model"],
            registry=registry,
        )
        self.model_changes = Counter(
            "maskserve_model_changes",
            "Models loaded and unloaded while serving, by model, action (load, reload, unload), why "
            "(request: the load or unload route; on_demand: a request to a model not loaded; "
            "eviction: to fit --models-memory; undo: a change that failed on a sibling worker, undone here; "
            "join: a worker catching up with its siblings) and result (ok, failed, refused: the budget or "
            "on-demand pacing).",
            ["model", "action", "reason", "result"],
            registry=registry,
        )
        self._state = ServingState()
        registry.register(self._state)
        # The process's own figures (start time, CPU, memory, open files), on this app's registry:
        # a restart shows as a new start time, not only as counters that fell back to zero.
        ProcessCollector(registry=registry)

    def watch_connections(self, guard: ConnectionGuard) -> None:
        """Export the client connections' figures, read from ``guard`` at scrape time."""
        self.registry.register(ConnectionState(guard))

    def attach(self, batcher: Batcher, admission: Admission | None = None, model_name: str | None = None) -> None:
        """Start observing one model's batches, and export its state (and admission's) at scrape time.

        ``model_name`` is the name clients use (``--model``'s NAME); the model's own, its source, is a
        label of its info too.
        """
        name = model_name or batcher.name
        batcher.listeners.append(lambda report: self.observe_batch(report, name))
        description = describe_model(batcher.model)
        load_seconds = description.get("load_seconds")
        self._state.lanes.append(
            Lane(name, batcher, admission, float(load_seconds) if isinstance(load_seconds, int | float) else None)
        )
        self.model_info.labels(model=name).info(
            {
                "name": name,
                "source": str(description.get("source", batcher.model.name)),
                "mask_token": batcher.model.mask_token,
                "device": str(description.get("device", "unknown")),
                "dtype": str(description.get("dtype", "unknown")),
                "maskserve_version": __version__,
            }
        )

    def detach(self, batcher: Batcher, model_name: str, *, series: bool = True) -> None:
        """Stop exporting an unloaded model's state; with ``series``, every series labelled with its
        name goes too (not after a reload, whose new model carries them on)."""
        self._state.lanes = [lane for lane in self._state.lanes if lane.batcher is not batcher]
        if series:
            for metric in self._per_model:
                _remove_series(metric, model_name)

    @property
    def _per_model(self) -> tuple[Counter | Histogram | Info, ...]:
        """Every series family with a ``model`` label that the batchers and requests feed."""
        return (
            self.requests,
            self.request_seconds,
            self.queue_wait_seconds,
            self.inference_seconds,
            self.batch_size,
            self.batch_padded_tokens,
            self.batch_padding_ratio,
            self.text_windows,
            self.busy_seconds,
            self.failed_texts,
            self.model_info,
        )

    def watch_models(self, states: Callable[[], ModelsState]) -> None:
        """Export the model repository's figures (models by state, each model's memory, the budget),
        read from its owner at scrape time."""
        self._state.models = states

    def watch_readiness(self, ready: Callable[[], bool]) -> None:
        """Export ``maskserve_ready`` from the readiness probe's own verdict, handed down by the layer
        that owns it, so the gauge and ``/readyz`` can never disagree."""
        self._state.ready = ready

    def observe_batch(self, report: BatchReport, model: str) -> None:
        """Batcher listener: one call per forward pass, on the event loop."""
        self.inference_seconds.labels(model=model).observe(report.seconds)
        self.busy_seconds.labels(model=model).inc(report.seconds)
        self.batch_size.labels(model=model).observe(report.size)
        self.batch_padded_tokens.labels(model=model).observe(report.padded_tokens)
        if report.padded_tokens > 0:
            self.batch_padding_ratio.labels(model=model).observe(1.0 - report.real_tokens / report.padded_tokens)
        if report.failed:
            self.failed_texts.labels(model=model).inc(report.failed)

    def observe_answers(self, answers: Sequence[Answer], windows: Sequence[int], model: str) -> None:
        """Queue waits of one request's answered rows, and how many windows each of its texts took."""
        waits = self.queue_wait_seconds.labels(model=model)
        for answer in answers:
            waits.observe(answer.queued_s)
        read = self.text_windows.labels(model=model)
        for count in windows:
            read.observe(count)

    def observe_request(
        self, route: str, status: int, kind: str, seconds: float, model: str = "", protocol: str = "http"
    ) -> None:
        self.requests.labels(protocol=protocol, route=route, status=str(status), kind=kind, model=model).inc()
        self.request_seconds.labels(protocol=protocol, route=route, model=model).observe(seconds)

    def model_statistics(self, model: str) -> ModelStatistics:
        """What this process has served of ``model``, read from its series (Triton's statistics)."""
        succeeded = failed = 0
        for metric in self.requests.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels["model"] == model:
                    if sample.labels["kind"] == "ok":
                        succeeded += int(sample.value)
                    else:
                        failed += int(sample.value)

        def count_and_sum(histogram: Histogram) -> tuple[int, float]:
            found = {"count": 0.0, "sum": 0.0}
            for metric in histogram.collect():
                for sample in metric.samples:
                    for part in found:
                        if sample.name.endswith("_" + part) and sample.labels.get("model") == model:
                            found[part] = sample.value
            return int(found["count"]), found["sum"]

        batches, texts = count_and_sum(self.batch_size)
        _, inference_s = count_and_sum(self.inference_seconds)
        waits, waited_s = count_and_sum(self.queue_wait_seconds)
        return ModelStatistics(succeeded, failed, int(texts), batches, inference_s, waits, waited_s)

    def exposition(self) -> tuple[bytes, str]:
        """The registry in Prometheus text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


@dataclass(frozen=True)
class ModelStatistics:
    """One model's counts since start: requests answered (ok or not), texts run, batches run, the
    seconds its forward passes took, and the rows answered with the seconds they waited."""

    succeeded: int
    failed: int
    texts: int
    batches: int
    inference_s: float
    queued_rows: int
    queued_s: float


def _remove_series(metric: Counter | Histogram | Info, model: str) -> None:
    """Every series of ``metric`` labelled with ``model``, removed (prometheus_client before 0.24
    has no removal by one label: each series is removed by all its label values)."""
    names = metric._labelnames  # the label names the metric was declared with, in order
    doomed = {
        tuple(sample.labels[name] for name in names)
        for family in metric.collect()
        for sample in family.samples
        if sample.labels.get("model") == model
    }
    for values in doomed:
        metric.remove(*values)
