"""service/served_model.py: a served model binds its tasks to its own settings, plans and folds on
the event loop or the tokenizer's thread, admits, queues and answers, and tells a request that
reached it after its release to retry."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest

from maskserve.config.model_settings import ModelConfig
from maskserve.config.settings import Settings
from maskserve.errors import DeadlineExceeded, ModelUnavailable, ShuttingDown
from maskserve.model_api import FillMaskModel, Query
from maskserve.observability.request_trace import NO_TRACE
from maskserve.request.keys import SERVICE_KEY
from maskserve.service.served_model import INLINE_DECODE_TOKENS, INLINE_TOKENIZE_CHARS, ServedModel
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask_request import FillMaskRequest
from tests.conftest import ClientFactory
from tests.fakes import EchoModel


def test_a_served_model_binds_its_tasks_to_its_own_settings(tmp_path: Path) -> None:
    settings = Settings(max_top_k=3)
    served = ServedModel(ModelConfig("m", str(tmp_path), settings))
    assert (served.name, served.settings, served.parts) == ("m", settings, None)
    assert served.fill_mask.parser is served.parser
    assert served.parser.settings is settings and served.score_parser.settings is settings


@dataclass(frozen=True)
class Ask:
    """A request of ``chars`` characters to tokenize whose answer decodes ``tokens`` tokens."""

    chars: int
    tokens: int = 0


@dataclass(frozen=True)
class Planned:
    ask: Ask
    thread: str
    model: FillMaskModel

    @property
    def queries(self) -> Sequence[Query]:
        return ()


class WhereTask:
    """A task that says which thread planned and folded it, and with which model."""

    def tokenizes(self, request: Ask) -> int:
        return request.chars

    def plan(self, request: Ask, model: FillMaskModel) -> Planned:
        return Planned(request, threading.current_thread().name, model)

    def decodes(self, plan: Planned) -> int:
        return plan.ask.tokens

    def fold(self, plan: Planned, answers: Sequence[Answer], model: FillMaskModel) -> tuple[str, FillMaskModel]:
        return threading.current_thread().name, model


@pytest.mark.parametrize(
    ("chars", "on_the_loop"), [(INLINE_TOKENIZE_CHARS, True), (INLINE_TOKENIZE_CHARS + 1, False)], ids=["short", "long"]
)
async def test_only_long_texts_are_tokenized_off_the_event_loop(
    make_client: ClientFactory, chars: int, on_the_loop: bool
) -> None:
    model = EchoModel()
    service = (await make_client(engine=model)).app[SERVICE_KEY]
    planned = await service.default.plan(WhereTask(), Ask(chars))
    assert planned.model is model
    if on_the_loop:
        assert planned.thread == threading.current_thread().name
    else:
        assert planned.thread.startswith("maskserve-tokenizer")


@pytest.mark.parametrize(
    ("tokens", "on_the_loop"), [(INLINE_DECODE_TOKENS, True), (INLINE_DECODE_TOKENS + 1, False)], ids=["few", "many"]
)
async def test_only_answers_that_decode_much_are_folded_off_the_event_loop(
    make_client: ClientFactory, tokens: int, on_the_loop: bool
) -> None:
    model = EchoModel()
    service = (await make_client(engine=model)).app[SERVICE_KEY]
    plan = Planned(Ask(1, tokens), "", model)
    thread, folded_with = await service.default.fold(WhereTask(), plan, [])
    assert folded_with is model
    if on_the_loop:
        assert thread == threading.current_thread().name
    else:
        assert thread.startswith("maskserve-tokenizer")


class RecordingTrace:
    """A request trace that keeps what it was told."""

    link: object = "this request"

    def __init__(self) -> None:
        self.served_with: list[tuple[list[Answer], int]] = []

    def step(self, name: str) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def served(self, answers: Sequence[Answer], queued_ns: int) -> None:
        self.served_with.append((list(answers), queued_ns))


async def test_a_request_is_planned_answered_and_folded_by_its_served_model(make_client: ClientFactory) -> None:
    service = (await make_client(engine=EchoModel())).app[SERVICE_KEY]
    served = service.default
    request = FillMaskRequest(texts=("a [MASK] b", "c d [MASK]"), batched=True, top_k=1, targets=None)
    plan = await served.plan(served.fill_mask, request)
    trace = RecordingTrace()
    deadline = asyncio.get_running_loop().time() + 5
    answers = await served.answer(plan.queries, deadline, trace)
    assert [answer.predictions[0][0]["sequence"] for answer in answers] == [
        str(query.input_ids) for query in plan.queries
    ]
    (told,) = trace.served_with
    assert told[0] == answers and told[1] > 0
    folded = await served.fold(served.fill_mask, plan, answers)
    assert [json.loads(answer.json)[0]["token_str"] for answer in folded] == ["echo", "echo"]


async def test_a_request_already_late_at_the_door_is_a_504(make_client: ClientFactory) -> None:
    service = (await make_client(engine=EchoModel())).app[SERVICE_KEY]
    with pytest.raises(DeadlineExceeded):
        service.default.at_door(asyncio.get_running_loop().time() - 0.1)


async def test_the_door_refuses_once_the_models_batcher_is_closed(make_client: ClientFactory) -> None:
    service = (await make_client(engine=EchoModel())).app[SERVICE_KEY]
    service.default.loaded.batcher.close()
    with pytest.raises(ShuttingDown):
        service.default.at_door(asyncio.get_running_loop().time() + 5)


async def test_a_request_admitted_with_no_time_left_is_a_504_before_it_queues(make_client: ClientFactory) -> None:
    service = (await make_client(engine=EchoModel())).app[SERVICE_KEY]
    query = Query(input_ids=(101, 4, 102), top_k=1)
    with pytest.raises(DeadlineExceeded):
        await service.default.answer([query], asyncio.get_running_loop().time() - 0.1, NO_TRACE)
    assert service.default.loaded.batcher.depth == 0


def test_a_request_of_a_model_released_under_it_is_told_to_retry(tmp_path: Path) -> None:
    served = ServedModel(ModelConfig("m", str(tmp_path), Settings()))
    with served.in_use():
        assert served.active == 1 and not served.quiet.is_set()
    assert served.active == 0 and served.quiet.is_set()
    served.released = True
    with (
        pytest.raises(ModelUnavailable, match="unloaded or reloaded before this request ran") as refused,
        served.in_use(),
    ):
        pass
    assert refused.value.status == 503 and refused.value.retry_after is not None
