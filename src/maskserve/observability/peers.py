"""The other workers of one server (``--workers``): what a worker needs of its siblings
(:class:`Peers`), and one exposition made of every worker's own, each sample labelled ``worker``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector


class Peers(Protocol):
    """The other processes of one server (``--workers``): a scrape of any of them reports all, and
    a change of models asked of one is forwarded to the others."""

    # This process's label value: the worker's slot, "0" to "N-1", stable across its restarts.
    worker: str

    async def expositions(self) -> list[tuple[str, bytes]]:
        """(worker, its own exposition) of every other live worker; a worker that does not
        answer in time is left out."""
        ...

    async def forward(self, path: str, body: bytes, headers: dict[str, str]) -> list[tuple[str, int, bytes]]:
        """POST ``body`` to ``path`` on every other worker: (worker, status, body) of each; status 0
        for a worker that did not answer."""
        ...


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def merge_expositions(parts: Sequence[tuple[str, bytes]]) -> bytes:
    """One exposition of several workers' own, each sample labelled ``worker``: per-worker series
    in one scrape, which ``sum by (...)`` adds up to the whole server."""
    families: dict[str, Metric] = {}
    for worker, text in parts:
        for family in text_string_to_metric_families(text.decode("utf-8")):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            merged.samples.extend(
                sample._replace(labels={**sample.labels, "worker": worker}) for sample in family.samples
            )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families.values()))
    return generate_latest(registry)
