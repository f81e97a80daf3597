"""The docs name files that exist, and the deployment page gives the commands that build and run.

Every path under deploy/, tests/, benchmarks/, examples/, docs/, src/ and .ci/ that the README,
CONTRIBUTING.md, a docs page or deploy/kubernetes/README.md names (a glob such as
`.ci/ensure-*` included) must match a file or folder of the repository.
"""

from __future__ import annotations

import re

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.deploy

PATH = re.compile(r"(?<![\w/.-])((?:deploy|tests|benchmarks|examples|docs|src|\.ci)/[\w./*-]*[\w*])")


def docs() -> dict[str, str]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    files.append(ROOT / "deploy" / "kubernetes" / "README.md")
    return {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in files}


def test_the_deployment_page_gives_the_build_and_apply_commands() -> None:
    page = docs()["docs/deployment.md"]
    assert "docker build -f deploy/Containerfile" in page
    assert "kubectl apply -k deploy/kubernetes" in page
    assert "kubectl apply -f deploy/kserve/inferenceservice.yaml" in page
    assert "haproxy -f deploy/haproxy.cfg" in page


def test_every_path_the_docs_name_exists() -> None:
    for doc, text in docs().items():
        for path in PATH.findall(text):
            assert any(ROOT.glob(path)), f"{doc} names {path}, which does not exist"
