"""The model repository on a running maskserve process: with ``--workers 2`` a load or unload
applies to every worker and the index agrees from any of them, a public client's peer headers
change nothing of that, a worker gunicorn restarts serves what its siblings serve, and a load that
fails on one worker is undone on the others; and the memory a model took comes back once it is
unloaded."""

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
def two_workers(tmp_path: Path, model_repository: Path, run_root: Path) -> Iterator[ServerProcess]:
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
        env={"TMPDIR": str(run_root)},
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


def served_by(url: str, model: str) -> set[str]:
    """The workers that have answered a request to ``model``, from the server's metrics."""
    metrics = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return {
        line.split('worker="')[1].split('"')[0]
        for line in metrics.splitlines()
        if line.startswith("maskserve_requests_total")
        and 'route="fill_mask_model"' in line
        and f'model="{model}"' in line
    }


def workers_of(arbiter: int) -> set[int]:
    return {int(child) for child in Path(f"/proc/{arbiter}/task/{arbiter}/children").read_text().split()}


@pytest.mark.slow
def test_a_public_clients_peer_headers_are_ignored_and_its_load_applied_by_both_workers(
    two_workers: ServerProcess,
) -> None:
    url = two_workers.url
    until(lambda: both_workers_answer(url))
    posing = CONTROL | {"X-Maskserve-Peer": "1", "X-Maskserve-Actor": "mallory"}
    status, body = post(url + "/v2/repository/models/beta/load", headers=posing)
    assert status == 200 and body == b"", body  # the public answer, not a sibling's
    for _ in range(16):
        entry = index(url)["beta"]
        assert entry["state"] == "READY" and "reason" not in entry, entry
        assert post(url + "/models/beta", PARIS.encode())[0] == 200
    assert served_by(url, "beta") == {"0", "1"}
    log = two_workers.log()
    loads = [line for line in log.splitlines() if "model load of 'beta' by " in line]
    assert len(loads) == 2, log  # one line a worker
    assert all(" by 127.0.0.1 (request " in line for line in loads) and "mallory" not in log


@pytest.mark.slow
def test_a_worker_gunicorn_restarts_serves_what_its_siblings_serve(two_workers: ServerProcess) -> None:
    url, arbiter = two_workers.url, two_workers.process.pid
    until(lambda: both_workers_answer(url) and len(workers_of(arbiter)) == 2)
    config = json.dumps({"parameters": {"config": json.dumps({"max_top_k": 3})}}).encode()
    status, body = post(url + "/v2/repository/models/beta/load", config, headers=CONTROL)
    assert status == 200, body
    status, body = post(url + "/v2/repository/models/alpha/unload", headers=CONTROL)
    assert status == 200, body
    victim = min(workers_of(arbiter))
    os.kill(victim, signal.SIGKILL)
    until(lambda: len(workers_of(arbiter)) == 2 and victim not in workers_of(arbiter))
    # The replacement loads the models named at start, then its siblings' (before its ports open):
    # until then the index shows the workers disagreeing, and only the survivor takes connections.
    until(lambda: both_workers_answer(url), timeout_s=240)
    assert "its siblings serve it" in two_workers.log()
    # Fresh connections land on both workers: each serves beta with the load's config (top_k 4
    # is past its max_top_k 3), and neither serves alpha, which was unloaded before the restart.
    for _ in range(16):
        assert index(url)["beta"]["state"] == "READY" and "reason" not in index(url)["beta"]
        assert post(url + "/models/beta", PARIS.encode())[0] == 200
        too_many = json.dumps({"inputs": PARIS, "parameters": {"top_k": 4}}).encode()
        assert post(url + "/models/beta", too_many, {"Content-Type": "application/json"})[0] == 422
        assert post(url + "/models/alpha", PARIS.encode())[0] == 404
    assert served_by(url, "beta") == {"0", "1"}
    assert "Traceback" not in two_workers.log()


@pytest.mark.slow
def test_a_load_a_worker_does_not_answer_is_undone_on_the_others(two_workers: ServerProcess, run_root: Path) -> None:
    url = two_workers.url
    until(lambda: both_workers_answer(url))
    status, body = post(url + "/v2/repository/models/beta/load", headers=CONTROL)
    assert status == 200, body
    # A third worker's private socket that nothing answers on (a worker hung, or just dead).
    (run_dir,) = run_root.glob("maskserve-workers-*")
    silent = run_dir / "worker-7.sock"
    silent.touch()
    status, body = post(url + "/v2/repository/models/gamma/load", headers=CONTROL)
    answer = json.loads(body)
    assert status == 500 and answer["error_type"] == "model_load_failed", answer
    assert answer["error"].startswith("model 'gamma' was not loaded on every worker: loaded on worker ")
    assert answer["error"].count("and undone") == 2 and answer["error"].endswith("; worker 7: answered nothing")
    # A reload cannot be undone: the answer says which worker serves which.
    status, body = post(url + "/v2/repository/models/beta/load", headers=CONTROL)
    assert status == 500 and json.loads(body)["error"] == (
        "model 'beta' was not loaded on every worker: reloaded on worker 0; reloaded on worker 1; "
        "worker 7: answered nothing"
    )
    silent.unlink()
    for _ in range(8):
        gamma = index(url)["gamma"]
        assert gamma["state"] == "UNAVAILABLE" and "worker" not in gamma.get("reason", ""), gamma
        assert index(url)["beta"]["state"] == "READY"
        assert post(url + "/models/gamma", PARIS.encode())[0] == 404
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
