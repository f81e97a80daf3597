"""--workers N: several processes on one port under gunicorn's arbiter, each a whole maskserve."""

from __future__ import annotations

import os
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from maskserve.config.cpus import available_cpus
from maskserve.config.settings import Settings
from maskserve.server.workers import _assign_slot
from tests.conftest import HAS_ONNXRUNTIME, NO_ONNXRUNTIME
from tests.live_server import ServerProcess, free_port, run_maskserve, start_maskserve, until

PARIS = b"Paris is the [MASK] of France."


def test_a_replacement_worker_takes_the_lowest_free_slot() -> None:
    workers = {1: SimpleNamespace(slot=0), 2: SimpleNamespace(slot=2)}
    arbiter = SimpleNamespace(WORKERS=workers, num_workers=3)
    new = SimpleNamespace()
    _assign_slot(arbiter, new)  # type: ignore[arg-type]
    assert new.slot == 1


def test_each_worker_gets_its_share_of_the_cpus() -> None:
    assert Settings(workers=1).resolved_threads() == available_cpus()
    assert Settings(workers=available_cpus() * 4).resolved_threads() == 1
    assert Settings(workers=2, threads=3).resolved_threads() == 3  # explicit wins


def children(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(child) for child in text.split()}


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


def post(url: str) -> bytes:
    request = urllib.request.Request(url, data=PARIS, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        body: bytes = response.read()
        return body


def worker_requests(url: str) -> dict[str, float]:
    families = text_string_to_metric_families(get(url + "metrics").decode())
    found: dict[str, float] = {}
    for family in families:
        if family.name == "maskserve_requests":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["route"] == "fill_mask":
                    found[sample.labels["worker"]] = found.get(sample.labels["worker"], 0) + sample.value
    return found


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[ServerProcess]:
    # Its own process group: the teardown's SIGKILL reaches the workers too.
    server = start_maskserve(
        "--workers", "2", "--drain-timeout", "10", log_path=tmp_path / "workers.log", own_process_group=True
    )
    try:
        yield server
    finally:
        server.kill()


@pytest.mark.slow
def test_two_workers_serve_one_port_report_together_replace_the_dead_and_drain_on_sigterm(
    two_workers: ServerProcess,
) -> None:
    server, url = two_workers, two_workers.url + "/"
    pid = server.process.pid
    # Both workers up: each answers its own slot's part of a scrape.
    until(lambda: len(children(pid)) == 2 and _both_ready(url))
    answers = [post(url) for _ in range(40)]
    assert all(b'"token_str": "city"' in answer for answer in answers)
    counted = worker_requests(url)
    assert sum(counted.values()) == 40  # every request, whichever worker took it, in one scrape
    # Each worker has its own SO_REUSEPORT socket: the kernel spreads the 40 connections over both.
    assert set(counted) == {"0", "1"} and min(counted.values()) > 0, counted

    # SIGKILL one worker: the arbiter starts another in its slot, and the server keeps answering.
    before = children(pid)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    until(lambda: len(children(pid)) == 2 and victim not in children(pid))
    until(lambda: _both_ready(url))
    assert b'"token_str": "city"' in post(url)

    # SIGTERM to the arbiter: every worker drains, the server exits 0.
    server.signal(signal.SIGTERM)
    assert server.wait(60) == 0, server.log()
    assert "Traceback" not in server.log()


def _both_ready(url: str) -> bool:
    """Both slots answer their part of /metrics (a worker still loading its model does not)."""
    text = get(url + "metrics").decode()
    return 'worker="0"' in text and 'worker="1"' in text


@pytest.mark.slow
def test_a_model_that_cannot_load_stops_every_worker_with_one_line(tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere"
    result = run_maskserve("--model", str(nowhere), "--port", str(free_port()), "--workers", "2")
    assert result.returncode == 1, result.stderr
    assert f"cannot start: could not load model {str(nowhere)!r}: no such folder {nowhere}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_taken_port_stops_the_workers_before_any_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_maskserve("--port", str(port), "--workers", "2")
    assert result.returncode == 2
    assert f"cannot start: cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Booting worker" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(not HAS_ONNXRUNTIME, reason=NO_ONNXRUNTIME)
def test_a_backend_that_cannot_serve_stops_every_worker_with_exit_2(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("", encoding="utf-8")
    result = run_maskserve(
        "--backend", "onnxruntime", "--cache-dir", str(not_a_folder), "--port", str(free_port()), "--workers", "2"
    )
    assert result.returncode == 2, result.stderr  # as a single process exits
    assert "cannot start: cannot write the export cache" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_every_worker_serves_every_model(bert_dir: Path, roberta_dir: Path, tmp_path: Path) -> None:
    server = start_maskserve(
        "--workers",
        "2",
        "--model",
        f"tiny={bert_dir}",
        "--model",
        f"rob={roberta_dir}",
        log_path=tmp_path / "workers.log",
        own_process_group=True,
    )
    try:
        url = server.url + "/"
        until(lambda: len(children(server.process.pid)) == 2 and _both_ready(url))
        for _ in range(20):
            assert b'"token_str"' in post(url + "models/tiny")
            request = urllib.request.Request(url + "models/rob", data=b"Paris is the <mask> of France.", method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                assert b'"token_str"' in response.read()
        text = get(url + "metrics").decode()
        served: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "maskserve_queue_limit":
                for sample in family.samples:
                    served.setdefault(sample.labels["worker"], set()).add(sample.labels["model"])
        assert served == {"0": {"tiny", "rob"}, "1": {"tiny", "rob"}}
    finally:
        server.kill()
