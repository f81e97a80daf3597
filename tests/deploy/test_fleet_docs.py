"""The README's "Running a fleet" and deploy/kubernetes/README.md point at files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
PATH = re.compile(r"(?<![\w/.-])((?:deploy|tests|benchmarks|\.ci)/[\w./-]*\w)")


def readme_sections() -> list[str]:
    return re.findall(r"^## (.+)$", (ROOT / "README.md").read_text(encoding="utf-8"), re.M)


def fleet_docs() -> dict[str, str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Running a fleet", 1)[1].split("\n## ", 1)[0]
    return {
        "README.md (Running a fleet)": section,
        "deploy/kubernetes/README.md": (ROOT / "deploy" / "kubernetes" / "README.md").read_text(encoding="utf-8"),
    }


def test_the_fleet_section_comes_just_before_configuration() -> None:
    sections = readme_sections()
    assert sections.index("Running a fleet") + 1 == sections.index("Configuration")


def test_the_fleet_docs_give_the_build_and_apply_commands() -> None:
    section = fleet_docs()["README.md (Running a fleet)"]
    assert "docker build -f deploy/Containerfile" in section
    assert "kubectl apply -k deploy/kubernetes" in section
    assert "haproxy -f deploy/haproxy.cfg" in section


def test_every_path_the_fleet_docs_name_exists() -> None:
    for doc, text in fleet_docs().items():
        for path in PATH.findall(text):
            assert (ROOT / path).exists(), f"{doc} names {path}, which does not exist"
