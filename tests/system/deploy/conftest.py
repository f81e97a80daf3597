"""The rendered manifests, once per session (each render is a kubectl run).

Only `tox -e deploy` selects these tests (marker `deploy`); it runs them with --confcutdir so the
suite's own conftest, which imports torch, is never loaded here.
"""

from __future__ import annotations

import pytest

from tests.system.deploy.manifests import Object, render


@pytest.fixture(scope="session")
def rendered() -> list[Object]:
    return render()
