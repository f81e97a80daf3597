"""Fixtures for the browser tests: the real server on the default model, and Debian's Chromium.

Playwright drives ``/usr/bin/chromium`` (``.ci/ensure-chromium`` installs it): its own browser
download does not work here, so ``playwright install`` is never run. Where Playwright itself is
not installed (the lowest env), these tests are not even collected.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pytest

from tests.live_server import start_maskserve, wait_until_ready
from tests.paths import ROOT

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, Request

collect_ignore_glob = [] if importlib.util.find_spec("playwright") else ["test_*.py"]

CHROMIUM = "/usr/bin/chromium"
# Headless Chromium in a container: no sandbox (no user namespaces), no GPU, and nothing that
# phones home (updates, sync, QUIC probes), so a test only ever talks to our server.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "artifacts"
# Loading the default model takes a few seconds; a cold machine with a busy disk, more.
SERVER_START_TIMEOUT = 120.0
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 375, "height": 740}


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


# The server and Chromium live as long as the browser tests (package scope), not the session: the
# same pytest session goes on to the rest of the suite, which must not find Playwright's event
# loop or an extra server still running.
@pytest.fixture(scope="package")
def server_url(artifacts: Path) -> Iterator[str]:
    """``python -m maskserve`` on the default model, on a free port, for the whole session."""
    server = start_maskserve(log_path=artifacts / "browser-server.log")
    try:
        try:
            wait_until_ready(server, SERVER_START_TIMEOUT)
        except RuntimeError as exc:
            pytest.fail(str(exc)[-3000:])
        yield server.url + "/"
    finally:
        server.stop()


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    from playwright.sync_api import expect, sync_playwright

    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run .ci/ensure-chromium (apt-get install chromium)")
    # The first answer of a cold server can take a few seconds on a busy CI machine.
    expect.set_options(timeout=20_000)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class Watched:
    """A page with everything that should never happen on it recorded: dialogs, script errors,
    console errors (CSP violations land there) and requests to any other origin."""

    page: Page
    origin: str
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.page.on("dialog", self._on_dialog)
        self.page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        self.page.on("console", self._on_console)
        self.page.on("request", self._on_request)

    def _on_dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def _on_request(self, request: Request) -> None:
        if not request.url.startswith((self.origin, "data:")):
            self.foreign_requests.append(request.url)

    def assert_clean(self) -> None:
        assert self.dialogs == []
        assert self.foreign_requests == []
        # An error status (422, 503) is logged by Chromium as a failed resource load; that is
        # the page working as designed. Anything else (CSP, script errors) is a bug.
        assert [e for e in self.errors if "the server responded with a status of" not in e] == []


class OpenPage(Protocol):
    def __call__(self, *, javascript: bool = True, viewport: dict[str, int] = ...) -> Watched: ...


@pytest.fixture
def open_page(browser: Browser, server_url: str) -> Iterator[OpenPage]:
    """``open_page(javascript=True, viewport=LAPTOP)``: a fresh context on the page, watched."""
    contexts = []

    def open_(*, javascript: bool = True, viewport: dict[str, int] = LAPTOP) -> Watched:
        context = browser.new_context(java_script_enabled=javascript, viewport=viewport)  # type: ignore[arg-type]
        contexts.append(context)
        watched = Watched(context.new_page(), server_url.rstrip("/"))
        watched.page.goto(server_url)
        return watched

    yield open_
    for context in contexts:
        context.close()
