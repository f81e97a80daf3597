"""Autoscaling, rollouts and disruptions: on maskserve's own load figure, without flapping."""

from __future__ import annotations

import pytest

from tests.system.deploy.manifests import Object, load_yaml, one, value
from tests.system.deploy.queries import exported_metrics

pytestmark = pytest.mark.deploy


def adapter_rules() -> list[dict[str, object]]:
    rules: list[dict[str, object]] = load_yaml("prometheus-adapter-rules.yaml")["rules"]
    return rules


def test_hpa_scales_on_a_per_pod_maskserve_metric_and_cpu(rendered: list[Object]) -> None:
    metrics = one(rendered, "HorizontalPodAutoscaler")["spec"]["metrics"]
    pods = [m["pods"] for m in metrics if m["type"] == "Pods"]
    assert len(pods) == 1
    assert pods[0]["metric"]["name"].startswith("maskserve_")
    assert pods[0]["target"]["type"] == "AverageValue"
    # A busy ratio is between 0 and 1: a target of 1 or more would never scale.
    assert 0 < value(pods[0]["target"]["averageValue"]) < 1
    cpu = [m["resource"] for m in metrics if m["type"] == "Resource"]
    assert [(r["name"], r["target"]["type"]) for r in cpu] == [("cpu", "Utilization")]


def test_the_adapter_publishes_the_metric_the_hpa_reads(rendered: list[Object]) -> None:
    metrics = one(rendered, "HorizontalPodAutoscaler")["spec"]["metrics"]
    wanted = {m["pods"]["metric"]["name"] for m in metrics if m["type"] == "Pods"}
    published = {rule["name"]["as"] for rule in adapter_rules()}  # type: ignore[index]
    assert wanted <= published
    for rule in adapter_rules():
        # Per pod: the adapter needs the namespace and pod labels to map series onto pods.
        assert rule["resources"] == {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}}


def test_the_adapter_reads_series_maskserve_exports() -> None:
    exported = exported_metrics()
    for rule in adapter_rules():
        series = str(rule["seriesQuery"]).split("{", 1)[0]
        assert series in exported, series


def test_scale_down_waits_so_the_fleet_does_not_flap(rendered: list[Object]) -> None:
    spec = one(rendered, "HorizontalPodAutoscaler")["spec"]
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 180
    assert 2 <= spec["minReplicas"] < spec["maxReplicas"]


def test_rollouts_never_drop_below_the_current_capacity(rendered: list[Object]) -> None:
    spec = one(rendered, "Deployment")["spec"]
    assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    # The autoscaler owns the replica count; a re-apply must not reset it.
    assert "replicas" not in spec


def test_disruptions_leave_a_replica_serving(rendered: list[Object]) -> None:
    budget = one(rendered, "PodDisruptionBudget")["spec"]
    floor = one(rendered, "HorizontalPodAutoscaler")["spec"]["minReplicas"]
    assert "minAvailable" not in budget
    assert floor - budget["maxUnavailable"] >= 1
