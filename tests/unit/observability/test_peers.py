"""One scrape of several workers: every worker's own exposition merged, each sample labelled ``worker``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from maskserve.observability.peers import merge_expositions


def exposition(requests: int) -> bytes:
    registry = CollectorRegistry()
    Counter("maskserve_requests", "h", ["route"], registry=registry).labels("fill_mask").inc(requests)
    return generate_latest(registry)


def test_one_scrape_labels_every_workers_series() -> None:
    merged = merge_expositions([("0", exposition(3)), ("1", exposition(4))]).decode()
    (family,) = [f for f in text_string_to_metric_families(merged) if f.name == "maskserve_requests"]
    totals = {s.labels["worker"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert totals == {"0": 3.0, "1": 4.0}
    assert merged.count("# TYPE maskserve_requests_total counter") == 1  # one family, not two


def test_a_family_only_one_worker_exports_keeps_its_own_labels_beside_the_worker() -> None:
    registry = CollectorRegistry()
    Gauge("maskserve_queue_depth", "h", ["model"], registry=registry).labels("en").set(5)
    merged = merge_expositions([("0", exposition(1)), ("1", generate_latest(registry))]).decode()
    (family,) = [f for f in text_string_to_metric_families(merged) if f.name == "maskserve_queue_depth"]
    assert [(s.labels, s.value) for s in family.samples] == [({"model": "en", "worker": "1"}, 5.0)]
