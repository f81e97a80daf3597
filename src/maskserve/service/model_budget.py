"""The models' memory budget (``--models-memory``): what each model holds, and what a load may take.

Every byte a model holds counts from the moment a load reserves it until the memory is back with
the system: a load in progress counts what it reserved, a serving model what its load measured, a
model being unloaded (or a load abandoned while its thread still runs) what it held, until its
release ends. A load that does not fit picks the least recently used idle models to evict; an
on-demand load may not evict a model younger than ``--model-min-residency`` (requests alternating
among more models than fit would otherwise evict and load on every turn). Plain bookkeeping: no
asyncio, no HTTP, no torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from maskserve.config.settings import NamedSettingsError
from maskserve.errors import LoadsPaced, ModelsMemoryExceeded

MIB = 1024 * 1024


@dataclass(frozen=True)
class Candidate:
    """A serving model that a load might evict."""

    name: str
    size: int
    last_used: float  # monotonic seconds
    loaded_at: float  # monotonic seconds
    idle: bool


class ModelBudget:
    """The bytes every model holds, and the choice of what to evict for a load; None: no budget."""

    def __init__(self, budget_bytes: int | None) -> None:
        self.budget_bytes = budget_bytes
        # Serving models, by name: what their load measured.
        self.charged: dict[str, int] = {}
        # Loads in progress, by name: what they reserved (their estimate, then their measure).
        self.reserved: dict[str, int] = {}
        # Memory on its way back (a model being unloaded, a reload's old model, an abandoned load):
        # a ticket each, released when the memory is.
        self.releasing: dict[int, int] = {}
        self._tickets = itertools.count()

    def held(self) -> int:
        """Every byte counted now: serving, reserved and on its way back."""
        return sum(self.charged.values()) + sum(self.reserved.values()) + sum(self.releasing.values())

    def releasing_from(self, size: int) -> int:
        """Count ``size`` bytes as on their way back; the ticket ends it (:meth:`released`)."""
        ticket = next(self._tickets)
        self.releasing[ticket] = size
        return ticket

    def released(self, ticket: int) -> None:
        self.releasing.pop(ticket, None)

    def fits(self, extra: int) -> bool:
        return self.budget_bytes is None or self.held() + extra <= self.budget_bytes

    def victims(
        self, name: str, need: int, candidates: list[Candidate], *, now: float, min_residency: float | None
    ) -> list[Candidate]:
        """The least recently used idle models to evict so that ``need`` more bytes fit, oldest use
        first; none when it fits already. With ``min_residency`` (an on-demand load), models loaded
        more recently than that are spared, and a load that would need one is paced.

        Raises :class:`ModelsMemoryExceeded` when even every idle model would not make room (nothing
        is to be evicted then), :class:`LoadsPaced` when only the young models stand in the way."""
        budget = self.budget_bytes
        if budget is None or self.fits(need):
            return []
        held = self.held()
        idle = sorted((c for c in candidates if c.idle and c.name != name), key=lambda c: c.last_used)
        old = [c for c in idle if min_residency is None or now - c.loaded_at >= min_residency]
        chosen = _enough(old, held + need - budget)
        if chosen is not None:
            return chosen
        everything = _enough(idle, held + need - budget)
        if everything is not None and min_residency is not None:
            young = [c for c in idle if c not in old]
            wait = min(min_residency - (now - c.loaded_at) for c in young)
            raise LoadsPaced(
                f"loading {name!r} would evict a model loaded less than {min_residency:g}s ago "
                "(--model-min-residency); retry after the Retry-After seconds",
                retry_after=max(1.0, wait),
            )
        freeable = sum(c.size for c in idle)
        raise ModelsMemoryExceeded(
            f"loading {name!r} needs about {need // MIB} MiB; the models hold {held // MIB} MiB of the "
            f"{budget // MIB} MiB budget (--models-memory, this worker's share) and only {freeable // MIB} MiB "
            "of them are idle; nothing was unloaded"
        )

    def over_by(self) -> int:
        """Bytes held past the budget now (0 within it): a load that measured more than it reserved."""
        if self.budget_bytes is None:
            return 0
        return max(0, self.held() - self.budget_bytes)


def _enough(candidates: list[Candidate], excess: int) -> list[Candidate] | None:
    """The first of ``candidates`` that together free ``excess`` bytes; None when all would not."""
    chosen, freed = [], 0
    for candidate in candidates:
        if freed >= excess:
            break
        chosen.append(candidate)
        freed += candidate.size
    return chosen if freed >= excess else None


class ModelsDoNotFit(NamedSettingsError):
    """The models named at start do not fit ``--models-memory`` (this worker's share): the server
    does not start (exit 2), and the message names them."""

    @classmethod
    def of(cls, sizes: dict[str, int], budget: int) -> ModelsDoNotFit:
        listed = ", ".join(f"{name!r} {size // MIB} MiB" for name, size in sizes.items())
        return cls(
            f"--models-memory: the models named at start hold {sum(sizes.values()) // MIB} MiB of weights on disk "
            f"({listed}), more than the {budget // MIB} MiB budget (this worker's share)"
        )

    @classmethod
    def measured(cls, name: str, size: int, budget: ModelBudget) -> ModelsDoNotFit:
        held = (budget.held() - size) // MIB
        limit = (budget.budget_bytes or 0) // MIB
        return cls(
            f"--models-memory: model {name!r} measured {size // MIB} MiB at its load; with the {held} MiB the "
            f"models before it hold, that passes the {limit} MiB budget (this worker's share)"
        )
