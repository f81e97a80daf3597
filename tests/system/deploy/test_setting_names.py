"""Every MASKSERVE_* variable the image, the manifests and the docs name is a real setting.

maskserve ignores a MASKSERVE_* variable it does not know, so a misspelt one in a manifest would
silently leave the default in force. The names come from the Settings dataclass itself.
"""

from __future__ import annotations

import configparser
import re

import pytest

from maskserve.config.flags import env_names as variables_of
from maskserve.config.settings import ENV_PREFIX, setting_fields
from tests.paths import ROOT
from tests.system.deploy import containerfile
from tests.system.deploy.manifests import Object, env_names

pytestmark = pytest.mark.deploy

VARIABLE = re.compile(r"\bMASKSERVE_[A-Z][A-Z0-9_]*")
# Every variable a setting reads, its older names included (MASKSERVE_TORCH_THREADS).
SETTINGS = {name for f in setting_fields() for name in variables_of(f) if name.startswith(ENV_PREFIX)}


def maskserve_variables(names: set[str]) -> set[str]:
    return {name for name in names if name.startswith(ENV_PREFIX)}


def test_the_image_sets_only_real_settings() -> None:
    named = maskserve_variables(set(containerfile.env()))
    assert named, "the image sets MASKSERVE_HOST at least"
    assert named - SETTINGS == set()


def test_the_manifests_set_only_real_settings(rendered: list[Object]) -> None:
    named = maskserve_variables(env_names(rendered))
    assert named - SETTINGS == set()


def suite_budgets() -> set[str]:
    """The test suite's own MASKSERVE_* variables (budgets for by-hand runs), which tox passes
    through to the tests; the docs name them too."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini", encoding="utf-8")
    return maskserve_variables(set(config["testenv"]["passenv"].split()))


def test_the_deploy_files_and_the_docs_name_only_real_settings() -> None:
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")]
    paths = [path for path in (ROOT / "deploy").rglob("*") if path.is_file()]
    texts = {path: path.read_text(encoding="utf-8") for path in paths}
    budgets = suite_budgets()
    assert budgets, "tox.ini passes the test budgets through"
    for path, text in texts.items():
        unknown = set(VARIABLE.findall(text)) - SETTINGS
        assert not unknown, f"{path.relative_to(ROOT)} names {sorted(unknown)}, which are not settings"
    for path in docs:
        unknown = set(VARIABLE.findall(path.read_text(encoding="utf-8"))) - SETTINGS - budgets
        assert not unknown, f"{path.relative_to(ROOT)} names {sorted(unknown)}, which are not settings"
