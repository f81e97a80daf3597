"""deploy/kserve: maskserve as a KServe custom predictor on the Open Inference Protocol, over HTTP and gRPC.

KServe's CRD schema is not in kubernetes-validate, but a predictor is a Kubernetes PodSpec plus
KServe's own fields: with those set aside, the rest is validated strictly as a 1.33 Pod.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.system.deploy import containerfile
from tests.system.deploy.manifests import KUBERNETES_VERSION, ROOT

pytestmark = pytest.mark.deploy

INFERENCE_SERVICE = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"
ROUTES = ROOT / "src" / "maskserve" / "http" / "routes.py"
# The PredictorSpec's fields that are KServe's, not the PodSpec's (serving.kserve.io/v1beta1).
KSERVE_PREDICTOR_FIELDS = {
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "containerConcurrency",
    "timeout",
}


@pytest.fixture(scope="module")
def isvc() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(INFERENCE_SERVICE.read_text(encoding="utf-8"))
    return loaded


def as_pod(isvc: dict[str, Any]) -> dict[str, Any]:
    predictor = {k: v for k, v in isvc["spec"]["predictor"].items() if k not in KSERVE_PREDICTOR_FIELDS}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": isvc["metadata"]["name"]}, "spec": predictor}


def container(isvc: dict[str, Any]) -> dict[str, Any]:
    (found,) = isvc["spec"]["predictor"]["containers"]
    assert isinstance(found, dict)
    return found


def env(isvc: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container(isvc)["env"]}


def test_it_is_an_inference_service_whose_predictor_is_a_valid_pod(isvc: dict[str, Any]) -> None:
    import kubernetes_validate

    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    assert kubernetes_validate.validate(as_pod(isvc), KUBERNETES_VERSION, strict=True) == "1.33"
    broken = copy.deepcopy(isvc)
    broken["spec"]["predictor"]["containers"][0]["readinessProbes"] = {}  # a typo must fail
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(as_pod(broken), KUBERNETES_VERSION, strict=True)


def test_the_model_name_in_the_v2_routes_is_the_services_name(isvc: dict[str, Any]) -> None:
    assert container(isvc)["name"] == "kserve-container"
    assert env(isvc)["MASKSERVE_MODEL_NAME"] == isvc["metadata"]["name"]


def served_get_paths() -> set[str]:
    """The GET paths of the route table (routes.ROUTES), read from its source: this env has no aiohttp."""
    tree = ast.parse(ROUTES.read_text(encoding="utf-8"))
    calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call))
    routes = (call for call in calls if isinstance(call.func, ast.Name) and call.func.id == "Route")
    return {
        route.args[1].value
        for route in routes
        if [ast.literal_eval(arg) for arg in route.args[:1]] == ["GET"] and isinstance(route.args[1], ast.Constant)
    }


def test_the_served_paths_are_read_from_the_route_table() -> None:
    assert {"/livez", "/readyz", "/v2/health/live", "/v2/health/ready"} <= served_get_paths()


def test_the_probes_are_the_protocols_health_routes_which_maskserve_serves(isvc: dict[str, Any]) -> None:
    served = served_get_paths()
    probes = {kind: container(isvc)[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/v2/health/ready"
    assert probes["livenessProbe"]["path"] == probes["startupProbe"]["path"] == "/v2/health/live"
    assert {p["path"] for p in probes.values()} <= served
    http = container(isvc)["ports"][0]
    assert {p["port"] for p in probes.values()} == {http["name"]} == {"http1"}
    assert str(http["containerPort"]) == env(isvc)["MASKSERVE_PORT"] == "8000"


def grpc_by_name(name: str) -> bool:
    """Whether KServe takes a container port of this name for gRPC: it gives its Service port the
    appProtocol kubernetes.io/h2c, and its Gateway API route sends gRPC calls there."""
    return "h2c" in name or "grpc" in name


def test_grpc_is_the_second_port_named_h2c_where_maskserve_serves_it(isvc: dict[str, Any]) -> None:
    http, grpc = container(isvc)["ports"]
    # The first port is HTTP: KServe routes everything but gRPC there, and scrapes /metrics on it.
    assert not grpc_by_name(http["name"])
    assert str(http["containerPort"]) == isvc["metadata"]["annotations"]["prometheus.kserve.io/port"]
    assert grpc_by_name(grpc["name"]) and grpc["name"] == "h2c"
    # maskserve listens where the port says: the image's gRPC port, Triton's.
    assert str(grpc["containerPort"]) == env(isvc)["MASKSERVE_GRPC_PORT"] == containerfile.env()["MASKSERVE_GRPC_PORT"]
    assert {http["protocol"], grpc["protocol"]} == {"TCP"}
    # Knative (KServe's Serverless mode) takes one port per container; two need RawDeployment.
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"


def test_shutdown_timing_and_resources_follow_the_fleet_rules(isvc: dict[str, Any]) -> None:
    predictor, values = isvc["spec"]["predictor"], env(isvc)
    drain = float(values["MASKSERVE_DRAIN_DELAY"] or 0) + float(values["MASKSERVE_DRAIN_TIMEOUT"] or 0)
    assert predictor["terminationGracePeriodSeconds"] > drain + 1
    readiness = container(isvc)["readinessProbe"]
    assert float(values["MASKSERVE_DRAIN_DELAY"] or 0) > readiness["periodSeconds"] * readiness["failureThreshold"]
    resources = container(isvc)["resources"]
    assert resources["requests"] == resources["limits"]
    threads = next(e for e in container(isvc)["env"] if e["name"] == "MASKSERVE_TORCH_THREADS")
    assert threads["valueFrom"]["resourceFieldRef"] == {
        "containerName": "kserve-container",
        "resource": "limits.cpu",
        "divisor": "1",
    }
    assert predictor["minReplicas"] >= 2


def test_the_predictor_runs_hardened_with_caches_on_empty_dirs(isvc: dict[str, Any]) -> None:
    predictor = isvc["spec"]["predictor"]
    assert predictor["securityContext"]["runAsNonRoot"] is True
    assert predictor["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert predictor["automountServiceAccountToken"] is False and predictor["enableServiceLinks"] is False
    hardening = container(isvc)["securityContext"]
    assert hardening["readOnlyRootFilesystem"] is True and hardening["allowPrivilegeEscalation"] is False
    assert hardening["capabilities"]["drop"] == ["ALL"]
    empty_dirs = {v["name"] for v in predictor["volumes"] if "emptyDir" in v}
    mounts = {m["mountPath"]: m["name"] for m in container(isvc)["volumeMounts"]}
    for path in ("/tmp", env(isvc)["HF_HOME"], env(isvc)["MASKSERVE_CACHE_DIR"]):
        assert mounts[str(path)] in empty_dirs, path


def test_the_deployment_page_points_to_it() -> None:
    page = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    assert str(Path("deploy/kserve/inferenceservice.yaml")) in page
