"""Where the tests find the repository's files, wherever a test module sits under tests/."""

from __future__ import annotations

from pathlib import Path

# The repository's root: docs/, deploy/, examples/, setup.cfg and artifacts/ hang from it.
ROOT = Path(__file__).resolve().parent.parent
# The tests' own root: data/ (the OpenAPI snapshot) hangs from it.
TESTS = ROOT / "tests"
