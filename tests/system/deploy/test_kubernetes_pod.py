"""The maskserve pod: probes, shutdown timing, CPUs and threads, memory, hardening, settings."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.system.deploy import containerfile
from tests.system.deploy.manifests import (
    Object,
    container,
    container_ports,
    cpus,
    env_entry,
    mebibytes,
    one,
    pod_spec,
    settings,
)

pytestmark = pytest.mark.deploy

# Peak resident memory of the default model as measured: 452 MiB in the benchmark,
# 509 MB (485 MiB) under the 2x overload soak.
MEASURED_PEAK_RSS_MIB = 485
# maskserve gives aiohttp this long past --drain-timeout to close connections (serve.py).
AIOHTTP_SHUTDOWN_MARGIN_S = 1


def test_probes_use_the_health_endpoints_on_the_served_port(rendered: list[Object]) -> None:
    main = container(rendered)
    assert container_ports(rendered)["http"] == int(settings(rendered)["MASKSERVE_PORT"])
    for probe, path in (("startupProbe", "/livez"), ("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        assert main[probe]["httpGet"] == {"path": path, "port": "http"}, probe


def test_grpc_is_served_on_the_grpc_port_as_the_image_serves_it(rendered: list[Object]) -> None:
    ports, data = container_ports(rendered), settings(rendered)
    assert list(ports) == ["http", "grpc"]
    # The port maskserve listens on is the one the pod declares, and the image's own (8001,
    # Triton's gRPC port): a container run without the manifests serves it at the same place.
    assert ports["grpc"] == int(data["MASKSERVE_GRPC_PORT"]) == int(containerfile.env()["MASKSERVE_GRPC_PORT"]) == 8001
    assert ports["http"] == int(data["MASKSERVE_PORT"]) == int(containerfile.env()["MASKSERVE_PORT"])


def test_model_loading_cannot_trip_liveness(rendered: list[Object]) -> None:
    # maskserve opens its port only once the model is loaded: until then every probe is refused.
    # The startup probe holds liveness off, for long enough to load a large model.
    startup = container(rendered)["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


def test_grace_period_covers_the_drain_delay_and_the_drain(rendered: list[Object]) -> None:
    grace = pod_spec(rendered)["terminationGracePeriodSeconds"]
    delay = float(settings(rendered)["MASKSERVE_DRAIN_DELAY"])
    drain = float(settings(rendered)["MASKSERVE_DRAIN_TIMEOUT"])
    assert grace > delay + drain + AIOHTTP_SHUTDOWN_MARGIN_S


def test_drain_delay_outlasts_the_readiness_probe_noticing(rendered: list[Object]) -> None:
    readiness = container(rendered)["readinessProbe"]
    delay = float(settings(rendered)["MASKSERVE_DRAIN_DELAY"])
    assert delay > readiness["periodSeconds"] * readiness["failureThreshold"]


def test_drain_timeout_lets_accepted_requests_meet_their_deadline(rendered: list[Object]) -> None:
    data = settings(rendered)
    assert float(data["MASKSERVE_DRAIN_TIMEOUT"]) >= float(data["MASKSERVE_REQUEST_TIMEOUT"])


def test_cpu_requests_equal_limits_in_whole_cpus(rendered: list[Object]) -> None:
    resources = container(rendered)["resources"]
    requested, limit = cpus(resources["requests"]["cpu"]), cpus(resources["limits"]["cpu"])
    assert requested == limit
    assert limit == limit.to_integral_value() and limit >= 1


def test_torch_threads_are_the_cpu_limit(rendered: list[Object]) -> None:
    entry = env_entry(rendered, "MASKSERVE_TORCH_THREADS")
    limit = cpus(container(rendered)["resources"]["limits"]["cpu"])
    if "value" in entry:
        assert Decimal(entry["value"]) == limit
    else:
        # Read from the limit itself (downward API), in whole CPUs.
        field = entry["valueFrom"]["resourceFieldRef"]
        assert field["resource"] == "limits.cpu"
        assert field["containerName"] == container(rendered)["name"]
        assert cpus(field.get("divisor", "1")) == 1
    assert "MASKSERVE_TORCH_THREADS" not in settings(rendered)


def test_memory_is_guaranteed_with_headroom_over_the_measured_peak(rendered: list[Object]) -> None:
    resources = container(rendered)["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert mebibytes(resources["limits"]["memory"]) >= Decimal("1.3") * MEASURED_PEAK_RSS_MIB


def test_the_pod_runs_hardened(rendered: list[Object]) -> None:
    pod = pod_spec(rendered)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert one(rendered, "ServiceAccount")["automountServiceAccountToken"] is False
    hardened = container(rendered)["securityContext"]
    assert hardened["allowPrivilegeEscalation"] is False
    assert hardened["readOnlyRootFilesystem"] is True
    assert hardened["capabilities"]["drop"] == ["ALL"]
    assert "privileged" not in hardened


def test_the_pod_runs_as_the_image_user(rendered: list[Object]) -> None:
    (user,) = [i.args for i in containerfile.final_stage() if i.keyword == "USER"]
    uid, _, gid = user.partition(":")
    context = pod_spec(rendered)["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (int(uid), int(gid))


def test_every_cache_is_on_an_empty_dir(rendered: list[Object]) -> None:
    pod, main = pod_spec(rendered), container(rendered)
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    mounted = {m["mountPath"] for m in main["volumeMounts"] if m["name"] in empty_dirs}
    image = containerfile.env()
    for name in ("HF_HOME", "MASKSERVE_CACHE_DIR"):
        path = env_entry(rendered, name)["value"]
        assert path in mounted, f"{name}={path} is not on an emptyDir"
        # The same paths as the image, so `docker run` and the pod write to the same places.
        assert path == image[name]
    assert "/tmp" in mounted
    # Each emptyDir has a ceiling: a runaway cache evicts its own pod, not the node's others.
    assert all(v["emptyDir"].get("sizeLimit") for v in pod["volumes"] if "emptyDir" in v)


def test_settings_come_from_the_config_map_and_the_key_from_an_optional_secret(rendered: list[Object]) -> None:
    data = settings(rendered)
    assert {"MASKSERVE_HOST", "MASKSERVE_PORT", "MASKSERVE_DRAIN_DELAY", "MASKSERVE_DRAIN_TIMEOUT"} <= set(data)
    assert "MASKSERVE_API_KEY" not in data
    key = env_entry(rendered, "MASKSERVE_API_KEY")["valueFrom"]["secretKeyRef"]
    # Optional: the default deploy starts without any Secret, keyless.
    assert key["optional"] is True


def test_service_links_are_off(rendered: list[Object]) -> None:
    # A Service named maskserve would otherwise inject MASKSERVE_PORT=tcp://10.x.y.z:8000, which
    # maskserve reads as its port setting and refuses at start-up (exit 2).
    services = {o["metadata"]["name"] for o in rendered if o["kind"] == "Service"}
    assert "maskserve" in services
    assert pod_spec(rendered)["enableServiceLinks"] is False
