"""Every MASKSERVE_* variable the image, the manifests and the fleet docs name is a real setting.

maskserve ignores a MASKSERVE_* variable it does not know, so a misspelt one in a manifest would
silently leave the default in force. The names come from the Settings dataclass itself.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from maskserve.settings import ENV_PREFIX, Settings

from . import containerfile
from .manifests import Object, env_names

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"\bMASKSERVE_[A-Z][A-Z0-9_]*")
SETTINGS = {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Settings)}


def maskserve_variables(names: set[str]) -> set[str]:
    return {name for name in names if name.startswith(ENV_PREFIX)}


def fleet_section() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("## Running a fleet", 1)[1].split("\n## ", 1)[0]


def test_the_image_sets_only_real_settings() -> None:
    named = maskserve_variables(set(containerfile.env()))
    assert named, "the image sets MASKSERVE_HOST at least"
    assert named - SETTINGS == set()


def test_the_manifests_set_only_real_settings(rendered: list[Object]) -> None:
    named = maskserve_variables(env_names(rendered))
    assert named - SETTINGS == set()


def test_the_deploy_files_and_fleet_docs_name_only_real_settings() -> None:
    texts = {path: path.read_text(encoding="utf-8") for path in (ROOT / "deploy").rglob("*") if path.is_file()}
    texts[ROOT / "README.md"] = fleet_section()
    texts[ROOT / "docs" / "operations.md"] = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    for path, text in texts.items():
        unknown = set(VARIABLE.findall(text)) - SETTINGS
        assert not unknown, f"{path.relative_to(ROOT)} names {sorted(unknown)}, which are not settings"
