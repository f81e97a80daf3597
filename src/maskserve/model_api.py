"""What the serving side needs from a model, with neither torch nor aiohttp.

The engine implements :class:`FillMaskModel`; the batcher and the views depend only on this
module, so tests can put a fault-injecting wrapper where the engine goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict


class Prediction(TypedDict):
    """One candidate for one mask, exactly the fill-mask pipeline's dict."""

    score: float
    token: int
    token_str: str
    sequence: str


# One text's answer: one list of predictions per mask, in text order.
TextPredictions = list[list[Prediction]]


@dataclass(frozen=True)
class Query:
    """One tokenized text to fill, with its own answer parameters."""

    input_ids: tuple[int, ...]
    top_k: int
    target_ids: tuple[int, ...] | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)


class FillMaskModel(Protocol):
    """A loaded fill-mask model. Only :meth:`predict` is heavy; it runs on the inference thread."""

    name: str
    mask_token: str
    max_tokens: int

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of ``text`` with special tokens."""
        ...

    def count_masks(self, input_ids: Sequence[int]) -> int:
        """How many mask tokens ``input_ids`` holds."""
        ...

    def resolve_targets(self, targets: Sequence[str]) -> tuple[int, ...]:
        """Vocabulary ids for ``targets``, deduplicated; empty when none is usable."""
        ...

    def predict(self, queries: Sequence[Query]) -> list[TextPredictions]:
        """One :data:`TextPredictions` per query, in order, from one forward pass."""
        ...

    def describe(self) -> dict[str, str | int | float]:
        """How the model runs (device, dtype, torch threads, versions, load_seconds), for ``/info``.

        Cheap and thread-safe. Test doubles may lack it: callers use :func:`describe_model`.
        """
        ...


def describe_model(model: FillMaskModel) -> dict[str, str | int | float]:
    """``model.describe()``, or an empty description for a model (a test double) without one."""
    describe = getattr(model, "describe", None)
    return dict(describe()) if callable(describe) else {}
