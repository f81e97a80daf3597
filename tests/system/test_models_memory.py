"""``--models-memory`` on a running maskserve: one budget for the whole server, every worker its
share. With ``--workers 2``, on-demand requests to more models than fit keep the workers' models,
and their resident memory together, within the budget; models named at start that do not fit are
a start-up error naming them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.servers import rss_bytes
from tests.conftest import CONTROL_KEY
from tests.live_server import (
    ServerProcess,
    free_port,
    maskserve_process,
    run_maskserve,
    start_maskserve,
    until,
    wait_until_ready,
)
from tests.models import build_bert
from tests.system.test_model_repository import CONTROL, PARIS, index, post, workers_of

MIB = 1024 * 1024
# Three models of about 50 MB of weights each: well above what RSS wanders by between two looks.
SHAPE = {"hidden_size": 512, "num_hidden_layers": 4, "intermediate_size": 2048, "num_attention_heads": 8}


@pytest.fixture(scope="module")
def large_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("large-models")
    for seed, name in enumerate(("alpha", "beta", "gamma")):
        build_bert(root / name, seed=seed, **SHAPE)
    return root


@pytest.fixture(scope="module")
def measured_mib(large_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> float:
    """What one of the models measures at a load after the process's first (the first, at start,
    also pays the runtime's one-time costs): the growth depends on the library's version, so the
    budget is built from it."""
    log_dir = tmp_path_factory.mktemp("measure")
    flags = ["--model-repository", str(large_repository), "--model-control-mode", "explicit"]
    with maskserve_process(*flags, "--control-key", CONTROL_KEY, log_dir=log_dir) as server:
        status, body = post(server.url + "/v2/repository/models/beta/load", headers=CONTROL)
        assert status == 200, body
        return int(index(server.url)["beta"]["memory_bytes"]) / MIB


@pytest.fixture
def workers_on_demand(
    tmp_path: Path, large_repository: Path, run_root: Path, measured_mib: float
) -> Iterator[tuple[ServerProcess, int]]:
    # Each worker's share is two and a half later loads: it holds any two of the models, never the
    # three, and the start-up model's first load, which measured from one to about two later loads
    # (the runtime's one-time costs land in it, more or less of them from process to process).
    budget = int(2 * 2.5 * measured_mib * MIB)
    server = start_maskserve(
        "--workers",
        "2",
        "--model-repository",
        str(large_repository),
        "--model-control-mode",
        "on-demand",
        "--control-key",
        CONTROL_KEY,
        "--models-memory",
        str(budget),
        "--model-min-residency",
        "0",
        log_path=tmp_path / "workers.log",
        own_process_group=True,
        env={"TMPDIR": str(run_root)},
    )
    try:
        wait_until_ready(server)
        yield server, budget
    finally:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(30)


def memory_series(url: str) -> dict[tuple[str, str], float]:
    """Every worker's ``maskserve_model_memory_bytes``, by (worker, model), from one scrape."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("maskserve_model_memory_bytes{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            found[(labels.get("worker", "0"), labels["model"])] = float(line.rsplit(" ", 1)[1])
    return found


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.load  # the sizes it builds its budget from move with the libraries' versions
def test_with_two_workers_on_demand_models_stay_within_one_budget_for_the_whole_server(
    workers_on_demand: tuple[ServerProcess, int],
) -> None:
    server, budget = workers_on_demand
    url = server.url
    until(lambda: len(workers_of(server.process.pid)) == 2)
    workers = workers_of(server.process.pid)
    before = sum(rss_bytes(pid) for pid in workers)
    statuses = []
    # Fresh connections, so that both workers take requests and load on demand.
    for _ in range(3):
        for model in ("beta", "gamma", "alpha"):
            statuses += [post(url + f"/models/{model}", PARIS.encode())[0] for _ in range(4)]
    assert set(statuses) == {200}, statuses
    charged = memory_series(url)
    assert {worker for worker, _ in charged} == {"0", "1"}
    assert sum(charged.values()) <= budget, charged
    for worker in ("0", "1"):  # each worker within its share
        assert sum(size for (w, _), size in charged.items() if w == worker) <= budget // 2
    grown = sum(rss_bytes(pid) for pid in workers) - before
    assert grown <= 1.15 * budget, f"the workers grew by {grown / MIB:.0f} MiB; the budget is {budget / MIB:.0f}"
    evicted = [entry for entry in index(url).values() if "evicted" in entry.get("reason", "")]
    assert evicted, index(url)  # three models did not all fit: something was evicted for the others


@pytest.mark.parametrize("workers", ["1", "2"])
def test_models_named_at_start_that_do_not_fit_exit_2_naming_them(
    tmp_path: Path, model_repository: Path, workers: str
) -> None:
    repository = tmp_path / "models"
    for name in ("alpha", "beta"):
        shutil.copytree(model_repository / name, repository / name)
        with open(repository / name / "padding.bin", "wb") as padding:  # sparse: on disk in name only
            padding.truncate(60 * MIB)
    args = ["--model-repository", str(repository), "--models-memory", "100MiB", "--workers", workers]
    done = run_maskserve("--port", str(free_port()), *args, env={"TMPDIR": "/tmp"}, timeout_s=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot start: --models-memory" in done.stderr and "'alpha' 60 MiB, 'beta' 60 MiB" in done.stderr
    assert "Traceback" not in done.stderr
