"""Docker for the image tests: the daemon, a local base image, a local torch index, containers.

Everything runs through Debian's client, /usr/bin/docker, with BuildKit on (deploy/Containerfile
needs it). Each process this module starts is stopped by its PID, each container by its name.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from tests.paths import ROOT
from tests.system.deploy.manifests import cpus, mebibytes

ARTIFACTS = ROOT / "artifacts"
DOCKER = "/usr/bin/docker"
DOCKERD = "/usr/sbin/dockerd"
# BuildKit: the Containerfile's RUN --mount needs it, and this client's legacy builder is the default.
DOCKER_ENV = {**os.environ, "DOCKER_BUILDKIT": "1"}
DEPLOYMENT = ROOT / "deploy" / "kubernetes" / "deployment.yaml"
SETTINGS_ENV = ROOT / "deploy" / "kubernetes" / "settings.env"
# The local base: Debian bookworm's own Python 3.11 from the machine's apt sources, with the machine's
# extra CA certificates so that pip in the build trusts the package registries as the host does.
BASE_PACKAGES = "python3.11,python3-pip,python3-venv,ca-certificates"
ROOTFS_IMAGE = "maskserve-test/rootfs:bookworm"
BASE_IMAGE = "maskserve-test/python:3.11-bookworm"
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
# A venv at /usr/local puts python and pip where the official python images have them.
BASE_CONTAINERFILE = f"FROM {ROOTFS_IMAGE}\nRUN python3 -m venv /usr/local\n"
TRUST_EXTRA_CA = "COPY *.crt /usr/local/share/ca-certificates/\nRUN update-ca-certificates\n"


def docker(*args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [DOCKER, *args], capture_output=True, text=True, env=DOCKER_ENV, timeout=timeout_s, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({result.returncode}): {result.stderr[-3000:]}")
    return result


def daemon_answers() -> bool:
    return docker("info", "--format", "{{.ServerVersion}}", timeout_s=30, check=False).returncode == 0


@contextlib.contextmanager
def running_daemon(log_path: Path, timeout_s: float = 60) -> Iterator[str]:
    """A Docker daemon for the block: the one already answering, or dockerd started here and stopped
    after (SIGTERM to its PID, so that it stops its containerd and containers; SIGKILL to its
    process group if it does not). Yields the server's version."""
    subprocess.run(["bash", str(ROOT / ".ci" / "ensure-docker")], check=True, timeout=600)
    process: subprocess.Popen[bytes] | None = None
    if not daemon_answers():
        if os.geteuid() != 0:
            raise RuntimeError("no Docker daemon answers, and starting dockerd needs root")
        with open(log_path, "wb") as log:
            process = subprocess.Popen([DOCKERD], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not daemon_answers():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: {log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
    try:
        yield docker("info", "--format", "{{.ServerVersion}}").stdout.strip()
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False).returncode == 0


def build_local_base(work: Path) -> str:
    """The Python base image, made from the machine's apt sources (no image registry is reachable
    here); reused when an earlier run left it in Docker's store."""
    if image_exists(BASE_IMAGE):
        return BASE_IMAGE
    rootfs = work / "rootfs.tar"
    subprocess.run(
        ["mmdebstrap", "--quiet", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(rootfs)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    docker("import", str(rootfs), ROOTFS_IMAGE, timeout_s=300)
    rootfs.unlink()
    context = work / "base"
    context.mkdir()
    certificates = sorted(EXTRA_CA_DIR.glob("*.crt"))
    for certificate in certificates:
        shutil.copy(certificate, context)
    text = BASE_CONTAINERFILE + (TRUST_EXTRA_CA if certificates else "")
    (context / "Containerfile").write_text(text, encoding="utf-8")
    docker("build", "-t", BASE_IMAGE, "-f", str(context / "Containerfile"), str(context), timeout_s=300)
    return BASE_IMAGE


@contextlib.contextmanager
def torch_index(work: Path) -> Iterator[str]:
    """A PEP 503 index on loopback holding the CPU torch wheel; yields its URL. The Containerfile
    installs torch alone from it (--no-deps; its dependencies come from the lock)."""
    folder = work / "simple" / "torch"
    folder.mkdir(parents=True)
    version = containerfile_default("TORCH_VERSION")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(folder), f"torch=={version}"],
        check=True,
        timeout=600,
    )
    wheels = [p.name for p in folder.glob("*.whl")]
    assert len(wheels) == 1 and "+cpu" in wheels[0], f"expected torch's CPU build, pip downloaded {wheels}"
    port = free_port()
    # http.server's directory listing is a valid PEP 503 project page: one link per file.
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port), "--directory", str(work)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/simple"
        wait_for(lambda: http_status(f"{url}/torch/") == 200, 30, "the torch index")
        yield url
    finally:
        server.terminate()
        server.wait(10)


def containerfile_default(name: str) -> str:
    for line in (ROOT / "deploy" / "Containerfile").read_text(encoding="utf-8").splitlines():
        if line.startswith(f"ARG {name}="):
            return line.split("=", 1)[1].strip().strip('"')
    raise LookupError(f"deploy/Containerfile has no default for {name}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_status(url: str, *, data: bytes | None = None, timeout_s: float = 5) -> int | None:
    """The status of one request, or None when nothing answered."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=timeout_s) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:  # refused, reset by docker's port proxy before the server listens, timed out
        return None


def wait_for(condition: Any, timeout_s: float, what: str) -> float:
    """Poll ``condition()`` until true; the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s}s")
        time.sleep(0.1)
    return time.monotonic() - started


@dataclass(frozen=True)
class PodSpec:
    """What deploy/kubernetes runs the container with, read from deployment.yaml itself."""

    options: list[str]  # docker run options with the same effect
    ports: dict[str, int]  # the container's ports by name ("http", "grpc")
    grace_s: int  # terminationGracePeriodSeconds: docker stop's timeout
    uid: int
    cpus: Decimal  # the CPU limit
    memory_mib: Decimal  # the memory limit


def pod_spec() -> PodSpec:
    """``docker run`` options for the manifests' pod: read-only root, the emptyDirs as tmpfs (owned
    by the pod's user: Docker's tmpfs are root's, Kubernetes' emptyDirs are writable by the pod),
    every capability dropped, no privilege escalation, the settings file, CPU and memory limits."""
    deployment = yaml.safe_load(DEPLOYMENT.read_text(encoding="utf-8"))
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    uid, gid = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    limits = container["resources"]["limits"]
    cpu, memory = cpus(limits["cpu"]), mebibytes(limits["memory"])
    options = ["--user", f"{uid}:{gid}", "--cpus", str(cpu), "--memory", f"{memory}m"]
    if security["readOnlyRootFilesystem"]:
        options.append("--read-only")
    options += [f"--cap-drop={cap}" for cap in security["capabilities"]["drop"]]
    if not security["allowPrivilegeEscalation"]:
        options += ["--security-opt", "no-new-privileges"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        size = mebibytes(volumes[mount["name"]]["emptyDir"]["sizeLimit"])
        options += ["--tmpfs", f"{mount['mountPath']}:size={size}m,uid={uid},gid={gid}"]
    assert [source["configMapRef"]["name"] for source in container["envFrom"]] == ["maskserve-settings"]
    options += ["--env-file", str(SETTINGS_ENV)]
    for entry in container["env"]:
        if "value" in entry:
            options += ["--env", f"{entry['name']}={entry['value']}"]
        elif entry.get("valueFrom", {}).get("resourceFieldRef", {}).get("resource") == "limits.cpu":
            options += ["--env", f"{entry['name']}={math.ceil(cpu)}"]
        # An optional Secret (the API key) that is not there: the pod runs without it.
    ports = {port["name"]: int(port["containerPort"]) for port in container["ports"]}
    return PodSpec(options, ports, int(pod["terminationGracePeriodSeconds"]), int(uid), cpu, memory)


@dataclass
class Container:
    """A detached container with its HTTP and gRPC ports each published on a loopback port."""

    name: str
    url: str
    grpc_target: str  # host:port, as gRPC channels and tritonclient.grpc take it
    started: float  # monotonic time of `docker run`

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return docker("exec", self.name, *argv, check=check)

    def inspect(self) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(docker("inspect", self.name).stdout)
        return found[0]

    def logs(self) -> str:
        result = docker("logs", self.name, check=False)
        return result.stdout + result.stderr


def run_container(image: str, name: str, options: Sequence[str], ports: Mapping[str, int]) -> Container:
    """``image`` run detached with the pod's ``ports`` ("http" and "grpc") published on loopback."""
    started = time.monotonic()
    published = [option for port in ports.values() for option in ("--publish", f"127.0.0.1::{port}")]
    docker("run", "--detach", "--name", name, *published, *options, image)
    http, grpc = published_port(name, ports["http"]), published_port(name, ports["grpc"])
    return Container(name, f"http://127.0.0.1:{http}/", f"127.0.0.1:{grpc}", started)


def published_port(name: str, port: int) -> str:
    """The loopback port Docker chose for the container's ``port``."""
    return docker("port", name, f"{port}/tcp").stdout.splitlines()[0].rsplit(":", 1)[1]


def remove_container(name: str) -> None:
    docker("rm", "--force", name, check=False)
