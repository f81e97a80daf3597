"""What the repository index says of every model: its state and why, as the repository holds it now.

A folder copied into the repository is listed at once, as not loadable (with what it lacks) while
its copy is under way; a folder deleted is forgotten unless its model still serves. No HTTP, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from maskserve.config.model_repository import ModelRepository
from maskserve.config.model_settings import ModelConfig
from maskserve.errors import ModelNotLoaded, NotFound
from maskserve.service.served_model import MODEL_VERSION, ModelTable


@dataclass
class ModelRecord:
    """What the repository index says of one model."""

    name: str
    state: str = "UNAVAILABLE"
    reason: str = "not loaded"
    # Resident bytes the model took when it was last loaded (measured); None before its first load.
    memory_bytes: int | None = None


@dataclass(frozen=True)
class IndexEntry:
    """One model of the index, as the protocol lists it."""

    name: str
    version: str
    state: str
    reason: str
    memory_bytes: int | None


class ModelCatalog:
    """Every model this server knows, by name, with its record."""

    def __init__(
        self,
        repository: ModelRepository | None,
        started: Mapping[str, ModelConfig],
        table: ModelTable,
        *,
        allows_changes: bool,
    ) -> None:
        self.repository = repository
        self.started = started
        self.table = table
        self.allows_changes = allows_changes
        self.records: dict[str, ModelRecord] = {}

    def record(self, name: str) -> ModelRecord:
        return self.records.setdefault(name, ModelRecord(name))

    def _repository_names(self) -> list[str]:
        return self.repository.names() if self.repository is not None else []

    def knows(self, name: str) -> bool:
        """A model this server could serve now: named at start, serving, or in the repository now."""
        return name in self.started or name in self.table.models or name in self._repository_names()

    def refresh(self, busy: Iterable[str] = ()) -> None:
        """Every record as the repository holds it now; ``busy``: models loading or unloading, kept."""
        in_repository = self._repository_names()
        known = {*self.started, *in_repository, *self.table.models, *busy}
        for name in list(self.records):
            if name not in known:
                del self.records[name]
        for name in sorted(known):
            record = self.record(name)
            if name in self.table.models and record.state == "UNAVAILABLE":
                record.state, record.reason = "READY", ""
            elif record.state == "UNAVAILABLE" and name in in_repository and self.repository is not None:
                missing = self.repository.missing(name)
                if missing:
                    record.reason = "not loadable: its folder lacks " + ", ".join(missing)
                elif record.reason.startswith("not loadable"):
                    record.reason = "not loaded"

    def entries(self, ready_only: bool = False, busy: Iterable[str] = ()) -> list[IndexEntry]:
        """Every model, by name, with its state and why (the repository index)."""
        self.refresh(busy)
        return [
            IndexEntry(r.name, MODEL_VERSION, r.state, r.reason, r.memory_bytes)
            for r in sorted(self.records.values(), key=lambda r: r.name)
            if not ready_only or r.state == "READY"
        ]

    def not_loaded(self, name: str) -> ModelNotLoaded:
        """The 404 for a known model that is not serving now, saying why and what would load it."""
        record = self.records.get(name) or ModelRecord(name)
        how = (
            f"load it with POST /v2/repository/models/{name}/load"
            if self.allows_changes
            else "this server's models are fixed at start (--model-control-mode none)"
        )
        return ModelNotLoaded(f"model {name!r} is not loaded ({record.state}: {record.reason}); {how}")

    def unknown(self, name: str, busy: Iterable[str] = ()) -> NotFound:
        """The 404 for a name that is no model of the repository's (nor named at start)."""
        self.refresh(busy)
        held = ", ".join(repr(known) for known in sorted(self.records)) or "none"
        return NotFound(f"no model named {name!r} in the model repository; it holds {held}")
