"""The source stands alone: its comments cite nothing outside the repository and carry no timings.

A comment gives its reason itself; a measured time goes stale with the next machine and belongs in
a benchmark's results, which a comment may name.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from tests.paths import ROOT

SOURCES = [
    *(ROOT / "src" / "maskserve").rglob("*.py"),
    *(ROOT / "benchmarks").glob("*.py"),
    *(ROOT / "tests").rglob("*.py"),
    ROOT / "docs" / "hooks.py",
]
# Files of the workplace, never of the repository.
OUTSIDE = re.compile(r"FIELD\.md|STYLE\.md|DEVELOPERS\.md|\.\./shared")
# A duration in milliseconds or microseconds is a measurement: no limit or default is set in them.
TIMING = re.compile(r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:ms|µs)\b")


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module."""
    text = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc


def test_no_comment_cites_a_file_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}" for path in SOURCES for line, text in prose(path) if OUTSIDE.search(text)
    ]
    assert not found, found


def test_no_comment_or_docstring_of_the_package_carries_a_measured_time() -> None:
    package = [path for path in SOURCES if "src" in path.parts]
    found = [
        f"{path.relative_to(ROOT)}:{line}: {match.group(0)}"
        for path in package
        for line, text in prose(path)
        for match in TIMING.finditer(text)
    ]
    assert not found, found


def test_the_app_and_its_requests_share_state_through_a_handful_of_typed_keys() -> None:
    package = [path for path in SOURCES if "src" in path.parts]
    keys = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in package
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"web\.(?:AppKey|RequestKey)\(", line)
    ]
    assert 1 <= len(keys) <= 8, keys


# How a test would start maskserve itself: the module run as a command. (This file and the check
# that the image runs what the tests run name it without running it; other servers, Prometheus or
# Docker, are started by their own helpers.)
STARTS_A_SERVER = re.compile(r"\"-m\", \"maskserve\"")


def test_only_the_live_server_helper_starts_maskserve_processes() -> None:
    tests = [
        path
        for path in SOURCES
        if "tests" in path.parts and path.name not in {"test_source.py", "test_containerfile.py"}
    ]
    starters = {
        str(path.relative_to(ROOT)) for path in tests if STARTS_A_SERVER.search(path.read_text(encoding="utf-8"))
    }
    assert starters == {"tests/live_server.py"}, starters
