"""The shape every task has: a request in, rows planned, the rows' answers folded back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from maskserve.model_api import FillMaskModel, Query
from maskserve.serving.costs import Work
from maskserve.serving.work_queue import Answer


class Plan(Protocol):
    """A request's rows, made by its task: what is admitted, queued and batched."""

    @property
    def queries(self) -> Sequence[Query]:
        """Every row the request queues, in the order its answers come back."""
        ...

    @property
    def windows(self) -> tuple[int, ...]:
        """How many windows each text is read in, in request order (1: read whole)."""
        ...


@runtime_checkable
class Rounds(Protocol):
    """A plan answered in rounds (a whole-word search): each round's rows are known only once the
    last round's are answered. Its :attr:`Plan.queries` are the first round's."""

    @property
    def bound(self) -> Work:
        """What all its rounds can cost together: what admission prices, once, before any work."""
        ...

    def next_round(self, answers: Sequence[Answer]) -> Sequence[Query]:
        """Take the last round's answers, in its rows' order; the next round's rows (none: done)."""
        ...


AskT = TypeVar("AskT", contravariant=True)
PlanT = TypeVar("PlanT", bound=Plan)
ResultT = TypeVar("ResultT", covariant=True)
# Invariant: for Ran, and for the functions that run any task (service/registry.py, request/run_task.py).
RequestT = TypeVar("RequestT")
AnswerT = TypeVar("AnswerT")


class Task(Protocol[AskT, PlanT, ResultT]):
    """One task of a served model, bound to that model's settings.

    ``plan`` and ``fold`` may be long (tokenizing long texts, decoding many whole words): the
    service runs them off the event loop when :meth:`tokenizes` or :meth:`decodes` say so.
    """

    def tokenizes(self, request: AskT) -> int:
        """Characters :meth:`plan` tokenizes for ``request``."""
        ...

    def plan(self, request: AskT, model: FillMaskModel) -> PlanT:
        """The request's rows for ``model``, checked (a 4xx names the first problem)."""
        ...

    def decodes(self, plan: PlanT) -> int:
        """Tokens :meth:`fold` decodes for ``plan`` (0 when it only does arithmetic)."""
        ...

    def fold(self, plan: PlanT, answers: Sequence[Answer], model: FillMaskModel) -> ResultT:
        """The task's answer from its rows' answers, one per row, in :attr:`Plan.queries` order."""
        ...


@dataclass(frozen=True)
class Ran(Generic[RequestT, AnswerT]):
    """A task run for a request: the request as its surface read it, the task's answer, every
    row's answer (how each was served: the timing headers, the metrics, the traces), and how many
    windows each text was read in."""

    request: RequestT
    result: AnswerT
    rows: list[Answer]
    windows: tuple[int, ...] = ()
