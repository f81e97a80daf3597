"""The image, built once per session from deploy/Containerfile, and a record of what it cost.

Only `tox -e image` selects these tests (marker `image`), with --confcutdir so the suite's own
conftest, which imports torch, is never loaded. A fresh machine gets Docker from Debian, a local
base image and a local torch index first; all of it is stopped again at the end of the session
(the base image stays in Docker's store for the next run).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.system.image.docker import (
    ARTIFACTS,
    ROOT,
    Container,
    build_local_base,
    docker,
    http_status,
    pod_spec,
    remove_container,
    run_container,
    running_daemon,
    torch_index,
    wait_for,
)

IMAGE = "maskserve-test/maskserve:ci"
READY_TIMEOUT_S = 120
# What the session measured, written to artifacts/image.json and printed at its end.
FIGURES: dict[str, Any] = {}
_names = iter(range(1_000_000))


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("image")
    ARTIFACTS.mkdir(exist_ok=True)
    began = time.monotonic()
    with running_daemon(ARTIFACTS / "image-dockerd.log") as version:
        FIGURES["docker_server"] = version
        FIGURES["docker_install_and_start_s"] = round(time.monotonic() - began, 1)
        step = time.monotonic()
        base = build_local_base(work)
        FIGURES["base_s"] = round(time.monotonic() - step, 1)
        step = time.monotonic()
        with torch_index(work) as index:
            # No image registry is reachable here: a local Debian Python replaces the official base.
            build = docker(
                "build",
                "--network=host",  # the torch index listens on the host's loopback
                "--progress=plain",
                "--file", str(ROOT / "deploy" / "Containerfile"),
                "--build-arg", f"PYTHON_IMAGE={base}",
                "--build-arg", f"TORCH_INDEX={index}",
                "--tag", IMAGE,
                str(ROOT),
                timeout_s=900,
                check=False,
            )  # fmt: skip
        (ARTIFACTS / "image-build.log").write_text(build.stdout + build.stderr, encoding="utf-8")
        assert build.returncode == 0, f"the build failed (artifacts/image-build.log): {build.stderr[-3000:]}"
        FIGURES["build_s"] = round(time.monotonic() - step, 1)
        FIGURES["image_size_mb"] = round(int(docker("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout) / 1e6)
        try:
            yield IMAGE
        finally:
            docker("image", "rm", "--force", IMAGE, check=False)
    FIGURES["session_s"] = round(time.monotonic() - began, 1)


def _start(image: str, names: list[str]) -> Container:
    """The image run as deploy/kubernetes runs it, once it answers /readyz 200."""
    name = f"maskserve-image-test-{os.getpid()}-{next(_names)}"
    names.append(name)
    spec = pod_spec()
    container = run_container(image, name, spec.options, spec.ports)
    try:
        wait_for(lambda: http_status(container.url + "readyz") == 200, READY_TIMEOUT_S, "/readyz 200")
    except TimeoutError as error:
        raise AssertionError(f"{error}; its log: {container.logs()[-3000:]}") from None
    FIGURES.setdefault("start_to_ready_s", []).append(round(time.monotonic() - container.started, 2))
    return container


@pytest.fixture(scope="module")
def serving(image: str) -> Iterator[Container]:
    """One container for the checks that leave it running."""
    names: list[str] = []
    try:
        yield _start(image, names)
    finally:
        for name in names:
            remove_container(name)


@pytest.fixture
def start_container(image: str) -> Iterator[Callable[[], Container]]:
    """``start_container()``: a container of its own, for a test that stops it; removed after."""
    names: list[str] = []
    try:
        yield lambda: _start(image, names)
    finally:
        for name in names:
            remove_container(name)


@pytest.fixture
def figures() -> dict[str, Any]:
    """The session's record: what a test adds here lands in artifacts/image.json."""
    return FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "image.json").write_text(json.dumps(FIGURES, indent=2) + "\n", encoding="utf-8")
    terminalreporter.write_line(f"image: {json.dumps(FIGURES)} (artifacts/image.json)")
