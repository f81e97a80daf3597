"""Debian's Prometheus on loopback, scraping the replicas with deploy/prometheus/scrape-config.yaml.

The job is rendered from the shipped file, as benchmarks/haproxy.py renders the HAProxy example:
its relabelling stays as written, and only what Kubernetes would supply changes. The pods'
discovery (kubernetes_sd_configs, which Debian's build leaves out) becomes one static target per
replica carrying the labels the discovery would give its pod: deployment.yaml's own labels and
prometheus.io annotations, a namespace, a pod name and IP. The annotated port is each replica's
own (three replicas on one machine cannot all listen on 8000). Scrapes and rule evaluations run
every second, so that rates have samples within seconds. The alert rules are loaded too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.servers import free_port
from tests.paths import ROOT
from tests.system.deploy.queries import RULES
from tests.system.fleet.fleet import ARTIFACTS, Replica

SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "scrape-config.yaml"
DEPLOYMENT = ROOT / "deploy" / "kubernetes" / "deployment.yaml"
NAMESPACE = "fleet"
INTERVAL = "1s"
HOST = "127.0.0.1"


def meta_label(prefix: str, key: str) -> str:
    """A Kubernetes label or annotation as the pod discovery names it: prometheus.io/port ->
    __meta_kubernetes_pod_annotation_prometheus_io_port."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def render_config(replicas: Sequence[Replica]) -> dict[str, Any]:
    """prometheus.yml: scrape-config.yaml's job over static stand-ins for the replicas' pods."""
    (job,) = yaml.safe_load(SCRAPE_CONFIG.read_text(encoding="utf-8"))["scrape_configs"]
    if "kubernetes_sd_configs" not in job or job.get("job_name") != "maskserve":
        raise ValueError(f"{SCRAPE_CONFIG} no longer has the shape this rendering expects")
    template = yaml.safe_load(DEPLOYMENT.read_text(encoding="utf-8"))["spec"]["template"]["metadata"]
    del job["kubernetes_sd_configs"]
    job["scrape_interval"] = INTERVAL
    job["static_configs"] = []
    for replica in replicas:
        pod = {meta_label("__meta_kubernetes_pod_label_", k): v for k, v in template["labels"].items()}
        pod |= {meta_label("__meta_kubernetes_pod_annotation_", k): v for k, v in template["annotations"].items()}
        pod |= {
            "__meta_kubernetes_pod_annotation_prometheus_io_port": str(replica.address.port),
            "__meta_kubernetes_namespace": NAMESPACE,
            "__meta_kubernetes_pod_name": replica.name,
            "__meta_kubernetes_pod_ip": replica.address.host,
            "__meta_kubernetes_pod_phase": "Running",
        }
        # The discovery's own address is the pod IP and a container port; the relabelling
        # replaces it with the annotated one.
        job["static_configs"].append({"targets": [f"{replica.address.host}:8000"], "labels": pod})
    return {
        "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(RULES)],
        "scrape_configs": [job],
    }


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise RuntimeError("prometheus is not installed: run .ci/ensure-prometheus (Debian package prometheus)")
    return found


class QueryError(AssertionError):
    """Prometheus refused a query (it does not parse, or cannot be evaluated)."""


class Prometheus:
    """One Prometheus server in its own process group; :meth:`query` and :meth:`query_range` through
    the HTTP API."""

    def __init__(self, folder: Path, replicas: Sequence[Replica]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.config_path = folder / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(render_config(replicas), sort_keys=False), encoding="utf-8")
        self.log_path = folder / "prometheus.log"
        self.url = f"http://{HOST}:{free_port(HOST)}"
        self.process: subprocess.Popen[bytes] | None = None
        self.session: aiohttp.ClientSession | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    prometheus_binary(),
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.folder / 'data'}",
                    f"--web.listen-address={self.url.removeprefix('http://')}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() kills all of it
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_path.read_text(errors='replace')[-3000:]}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response,
            ):
                if response.status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready within {timeout_s}s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    async def api(self, path: str, **params: str) -> Any:
        assert self.session is not None
        async with self.session.get(self.url + "/api/v1/" + path, params=params) as response:
            body = await response.json()
        if body.get("status") != "success":
            raise QueryError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: its series, each ``{"metric": labels, "value": [time, "text"]}``."""
        data = await self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else []
        return result

    async def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query over ``[start, end]`` (Unix times), a point every ``step`` seconds: its
        series, each ``{"metric": labels, "values": [[time, "text"], ...]}``."""
        data = await self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "matrix" else []
        return result

    async def by_pod(self, expr: str) -> dict[str, float]:
        return {series["metric"]["pod"]: float(series["value"][1]) for series in await self.query(expr)}

    async def wait_for(self, expr: str, condition: Any, timeout_s: float, what: str) -> tuple[float, Any]:
        """Poll ``expr`` until ``condition(result)``; (seconds it took, the result)."""
        started = time.monotonic()
        while True:
            result = await self.by_pod(expr)
            if condition(result):
                return time.monotonic() - started, result
            if time.monotonic() - started > timeout_s:
                raise AssertionError(f"{what}: not within {timeout_s}s; last {expr} = {result}")
            await asyncio.sleep(1.0)


@contextlib.asynccontextmanager
async def running_prometheus(folder: Path, replicas: Sequence[Replica]) -> AsyncIterator[Prometheus]:
    prometheus = Prometheus(folder, replicas)
    try:
        await asyncio.to_thread(prometheus.start)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            prometheus.session = session
            yield prometheus
    finally:
        prometheus.session = None
        prometheus.stop()
        kept = ARTIFACTS / "fleet-logs"
        kept.mkdir(parents=True, exist_ok=True)
        for name in ("prometheus.log", "prometheus.yml"):
            if (folder / name).exists():
                shutil.copy(folder / name, kept / name)
