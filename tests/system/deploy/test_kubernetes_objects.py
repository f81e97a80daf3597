"""deploy/kubernetes as rendered: valid Kubernetes 1.33 objects that point at each other."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.system.deploy.manifests import (
    KUBERNETES_VERSION,
    KUSTOMIZE_DIR,
    Object,
    container_ports,
    load_yaml,
    matches,
    one,
    pod_spec,
)

pytestmark = pytest.mark.deploy

EXPECTED_KINDS = {
    "ServiceAccount",
    "ConfigMap",
    "Service",
    "Deployment",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "NetworkPolicy",
}


def test_every_object_validates_strictly_against_kubernetes_1_33(rendered: list[Object]) -> None:
    # kubernetes-validate carries the schemas in the package: nothing is fetched.
    import kubernetes_validate

    for obj in rendered:
        # Raises on an invalid object, and on a kind it has no schema for (never "unchecked").
        checked = kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert checked == "1.33", f"{obj['kind']} checked against {checked}"


def test_strict_validation_refuses_a_misspelt_field(rendered: list[Object]) -> None:
    # The check above is only worth something if a typo fails it.
    import kubernetes_validate

    deployment = copy.deepcopy(one(rendered, "Deployment"))
    probed = deployment["spec"]["template"]["spec"]["containers"][0]
    probed["readinesProbe"] = probed.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_renders_one_of_each_kind(rendered: list[Object]) -> None:
    kinds = [obj["kind"] for obj in rendered]
    assert sorted(kinds) == sorted(EXPECTED_KINDS)
    assert one(rendered, "HorizontalPodAutoscaler")["apiVersion"] == "autoscaling/v2"


def test_operator_and_adapter_files_stay_out_of_the_default_apply() -> None:
    kustomization = yaml.safe_load((KUSTOMIZE_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    assert "servicemonitor.yaml" not in kustomization["resources"]
    assert "prometheus-adapter-rules.yaml" not in kustomization["resources"]
    # Both exist, and parse.
    assert load_yaml("servicemonitor.yaml")["kind"] == "ServiceMonitor"
    assert load_yaml("prometheus-adapter-rules.yaml")["rules"]


def test_every_selector_selects_the_pods(rendered: list[Object]) -> None:
    deployment = one(rendered, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert matches(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    assert matches(one(rendered, "Service")["spec"]["selector"], pod_labels)
    assert matches(one(rendered, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod_labels)
    assert matches(one(rendered, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"], pod_labels)
    target = one(rendered, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert pod_spec(rendered)["serviceAccountName"] == one(rendered, "ServiceAccount")["metadata"]["name"]


def test_the_service_reaches_each_container_port_on_its_own_number(rendered: list[Object]) -> None:
    ports = container_ports(rendered)
    service_ports = {p["name"]: p for p in one(rendered, "Service")["spec"]["ports"]}
    assert list(service_ports) == list(ports) == ["http", "grpc"]
    for name, port in service_ports.items():
        assert port["targetPort"] == name and port["port"] == ports[name]
    # gRPC is HTTP/2 without TLS: the standard appProtocol lets proxies and meshes speak it.
    assert service_ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"
    assert "appProtocol" not in service_ports["http"]


def test_the_optional_service_monitor_scrapes_the_service(rendered: list[Object]) -> None:
    monitor = load_yaml("servicemonitor.yaml")
    service = one(rendered, "Service")
    assert matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_prometheus_annotations_point_at_the_metrics_endpoint(rendered: list[Object]) -> None:
    annotations = one(rendered, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert annotations["prometheus.io/port"] == str(container_ports(rendered)["http"])


def test_network_policy_opens_the_http_and_grpc_ports_and_allows_no_egress(rendered: list[Object]) -> None:
    policy = one(rendered, "NetworkPolicy")["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    (rule,) = policy["ingress"]
    assert [p["port"] for p in rule["ports"]] == list(container_ports(rendered)) == ["http", "grpc"]
    assert {p["protocol"] for p in rule["ports"]} == {"TCP"}
    # No egress rule with Egress in policyTypes: every outgoing connection is refused.
    assert not policy.get("egress")
