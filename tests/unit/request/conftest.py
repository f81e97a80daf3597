"""Fakes for the model repository across workers: a control over a dict of served models, and
siblings that answer from a function."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from maskserve.config.settings import Settings
from maskserve.errors import MaskserveError
from maskserve.service.model_catalog import IndexEntry
from maskserve.service.registry import FillMaskService

Answer = tuple[str, int, bytes]


class FakeServed:
    """Stands for a served model: only its identity matters here."""


class FakeControl:
    """The control's public calls over a dict of served models; a load of a name in ``failing`` fails."""

    allows_changes = True

    def __init__(self, service: FillMaskService, known: tuple[str, ...] = ("alpha", "beta", "gamma")) -> None:
        self.service = service
        self.known = known
        self.failing: dict[str, MaskserveError] = {}
        self.calls: list[tuple[str, str, dict[str, Any] | None, str]] = []

    def knows(self, name: str) -> bool:
        return name in self.known

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries = [
            IndexEntry(name, "1", "READY" if name in self.service.models else "UNAVAILABLE", "", None)
            for name in self.known
        ]
        return [entry for entry in entries if entry.state == "READY" or not ready_only]

    async def load(
        self, name: str, overrides: dict[str, Any] | None = None, *, reason: str = "request", actor: str = ""
    ) -> None:
        self.calls.append(("load", name, overrides, reason))
        if name in self.failing:
            raise self.failing[name]
        self.service.models[name] = FakeServed()  # type: ignore[assignment]

    async def unload(self, name: str, *, reason: str = "request", actor: str = "") -> None:
        self.calls.append(("unload", name, None, reason))
        self.service.models.pop(name, None)


class FakePeers:
    """Siblings that answer each request from ``answer(path, headers)``, and remember what they were sent."""

    worker = "0"

    def __init__(self, answer: Callable[[str, dict[str, str]], list[Answer]]) -> None:
        self.answer = answer
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []

    async def expositions(self) -> list[tuple[str, bytes]]:
        return []

    async def forward(self, path: str, body: bytes, headers: dict[str, str]) -> list[Answer]:
        self.sent.append((path, body, headers))
        return self.answer(path, headers)


@pytest.fixture
def service() -> Iterator[FillMaskService]:
    made = FillMaskService(Settings())
    made.models.clear()  # nothing serves until a test loads it
    made.control = FakeControl(made)  # type: ignore[assignment]
    yield made
