"""Three replicas for the whole fleet suite, a fresh HAProxy per test, and the expected answers.

Only the marker `fleet` selects these tests (`tox -e quick -- tests/system/fleet -m fleet`). The replicas
start once (each start costs seconds of imports on 2 cores); every test leaves all three running, and `whole_fleet`
restarts any that a failed test left down, so one failure does not cascade.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks.haproxy import Address, HAProxy
from benchmarks.servers import free_port
from tests.system.fleet.fleet import ARTIFACTS, Replica, Workload, direct_answers

BALANCER_HOST = "127.0.0.10"
REPLICA_HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")

# Answers the default model gives with a clear lead for its top token (see direct_answers), of
# different lengths so that batches carry padding.
SENTENCES = [
    "Paris is the [MASK] of France.",
    "The capital of Italy is [MASK].",
    "A week has seven [MASK].",
    "The sun rises in the [MASK].",
    "She opened the [MASK] and walked into the room.",
]


@pytest.fixture(scope="package")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    log_dir = tmp_path_factory.mktemp("replicas")
    replicas = [
        Replica(Address(f"replica{i}", host, free_port(host), free_port(host)), log_dir)
        for i, host in enumerate(REPLICA_HOSTS, 1)
    ]
    try:
        for replica in replicas:
            replica.start()
        for replica in replicas:
            replica.wait_ready()
        yield replicas
    finally:
        for replica in replicas:
            replica.kill_group()
        # The replicas' own logs, for a CI run that failed (artifacts/ is not committed).
        kept = ARTIFACTS / "fleet-logs"
        kept.mkdir(parents=True, exist_ok=True)
        for replica in replicas:
            if replica.log_path.exists():
                shutil.copy(replica.log_path, kept / replica.log_path.name)


@pytest.fixture
def whole_fleet(fleet: list[Replica]) -> list[Replica]:
    """The three replicas, each running and ready (restarted if an earlier test left it down)."""
    for replica in fleet:
        if not replica.running:
            replica.start()
    for replica in fleet:
        replica.wait_ready()
    return fleet


@pytest.fixture(scope="package")
def workload(fleet: list[Replica]) -> Workload:
    return direct_answers(fleet[0].url, SENTENCES)


@pytest.fixture
def balancer(tmp_path: Path, whole_fleet: list[Replica]) -> Iterator[Callable[..., HAProxy]]:
    """``balancer(l7_retries=...)``: deploy/haproxy.cfg in front of the fleet, every server UP."""
    started: list[HAProxy] = []

    def start(*, l7_retries: bool) -> HAProxy:
        haproxy = HAProxy(
            tmp_path / f"haproxy{len(started)}",
            bind=(BALANCER_HOST, free_port(BALANCER_HOST)),
            servers=[replica.address for replica in whole_fleet],
            l7_retries=l7_retries,
        )
        started.append(haproxy)
        haproxy.start()
        return haproxy

    try:
        yield start
    finally:
        kept = ARTIFACTS / "fleet-logs"
        kept.mkdir(parents=True, exist_ok=True)
        for i, haproxy in enumerate(started):
            haproxy.stop()
            shutil.copy(haproxy.log_path, kept / f"haproxy-{tmp_path.name}-{i}.log")
