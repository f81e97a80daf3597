"""The model repository on a running maskserve process: with ``--workers 2`` a load or unload
applies to every worker and the index agrees from any of them, and the memory a model took comes
back once it is unloaded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.servers import rss_bytes
from tests.conftest import CONTROL_KEY
from tests.live_server import ServerProcess, maskserve_process, start_maskserve, until
from tests.models import build_bert

CONTROL = {"Authorization": f"Bearer {CONTROL_KEY}"}
PARIS = "paris is the [MASK] of france."
MIB = 1024 * 1024


def post(url: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request on a connection of its own (so that, with workers, the kernel picks its worker)."""
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def index(url: str) -> dict[str, dict[str, str]]:
    status, body = post(url + "/v2/repository/index")
    assert status == 200, body
    return {entry["name"]: entry for entry in json.loads(body)}


@pytest.fixture
def two_workers(tmp_path: Path, model_repository: Path) -> Iterator[ServerProcess]:
    server = start_maskserve(
        "--workers",
        "2",
        "--model-repository",
        str(model_repository),
        "--model-control-mode",
        "explicit",
        "--control-key",
        CONTROL_KEY,
        log_path=tmp_path / "workers.log",
        own_process_group=True,
    )
    try:
        yield server
    finally:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(30)


def both_workers_answer(url: str) -> bool:
    """Both workers up, each on its private socket (a load is forwarded only to the workers whose
    socket is there), and the index the same from both."""
    metrics = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    status, body = post(url + "/v2/repository/index")
    both = 'worker="0"' in metrics and 'worker="1"' in metrics
    return both and status == 200 and "worker" not in body.decode() and b"alpha" in body


@pytest.mark.slow
def test_with_two_workers_a_load_and_an_unload_apply_to_every_worker(two_workers: ServerProcess) -> None:
    url = two_workers.url
    until(lambda: both_workers_answer(url) and index(url)["alpha"]["state"] == "READY")
    status, body = post(url + "/v2/repository/models/beta/load", headers=CONTROL)
    assert status == 200, body
    # Fresh connections land on both workers: every one finds beta loaded, and the same index.
    for _ in range(16):
        assert index(url)["beta"]["state"] == "READY"
        status, answer = post(url + "/models/beta", PARIS.encode())
        assert status == 200 and len(json.loads(answer)) == 5
    metrics = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    served_by = {
        line.split('worker="')[1].split('"')[0]
        for line in metrics.splitlines()
        if line.startswith("maskserve_requests_total") and 'route="fill_mask_model"' in line and 'model="beta"' in line
    }
    assert served_by == {"0", "1"}, "both workers served beta"
    status, body = post(url + "/v2/repository/models/beta/unload", headers=CONTROL)
    assert status == 200, body
    for _ in range(8):
        assert index(url)["beta"]["state"] == "UNAVAILABLE"
        assert post(url + "/models/beta", PARIS.encode())[0] == 404
    assert "Traceback" not in two_workers.log()


@pytest.mark.slow
def test_the_memory_a_model_took_comes_back_after_its_unload(tmp_path: Path, model_repository: Path) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    shutil.copytree(model_repository / "alpha", repository / "alpha")
    # About 100 MB of weights: well above what RSS wanders by between two looks.
    build_bert(
        repository / "large", hidden_size=512, num_hidden_layers=8, intermediate_size=2048, num_attention_heads=8
    )
    flags = ["--model-repository", str(repository), "--model-control-mode", "explicit", "--control-key", CONTROL_KEY]
    with maskserve_process(*flags, log_dir=tmp_path) as server:
        pid, url = server.process.pid, server.url
        assert post(url + "/", PARIS.encode())[0] == 200
        before = rss_bytes(pid)
        status, body = post(url + "/v2/repository/models/large/load", headers=CONTROL)
        assert status == 200, body
        for _ in range(20):
            assert post(url + "/models/large", PARIS.encode())[0] == 200
        loaded = rss_bytes(pid)
        size = index(url)["large"]["memory_bytes"]
        assert loaded - before > 60 * MIB and int(size) > 60 * MIB, (before, loaded, size)
        status, body = post(url + "/v2/repository/models/large/unload", headers=CONTROL)
        assert status == 200, body
        after = rss_bytes(pid)
        assert after - before < 30 * MIB, (
            f"before {before / MIB:.0f} MiB, loaded {loaded / MIB:.0f}, after {after / MIB:.0f}"
        )
        assert post(url + "/", PARIS.encode())[0] == 200
