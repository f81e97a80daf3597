"""What the system tests of workers share."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def run_root() -> Iterator[Path]:
    """The servers' temporary directory (TMPDIR), where the workers' private sockets are: short, as
    a Unix socket's path must be."""
    root = Path(tempfile.mkdtemp(prefix="msw-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
